"""The layout shows the architecture: the runtime never imports torch, stages never import trio."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("omnitrio", {"torch", "transformers"}), ("stages", {"trio", "trio_websocket", "quart_trio"})],
)
def test_forbidden_imports(package: str, forbidden: set[str]) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    for path in files:
        assert not (_imports(path) & forbidden), f"{path.relative_to(REPO)} imports {forbidden}"


def test_no_sleeping_in_the_runtime() -> None:
    # Waiting is always on an event or a channel: no sleep anywhere in the runtime.
    # omnitrio/bench is a load generator, not the runtime: it paces arrivals on a
    # clock, and its orchestrator-shape and vllm-omni-model baselines poll on purpose
    # (that is the design they model).
    bench = REPO / "omnitrio" / "bench"
    for path in sorted((REPO / "omnitrio").rglob("*.py")):
        if path.is_relative_to(bench):
            continue
        source = path.read_text()
        assert "sleep(" not in source, f"{path.relative_to(REPO)} sleeps"


def _relative_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.module.rsplit(".", 1)[-1]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level > 0
    }


def test_the_server_has_no_stage_loop_of_its_own() -> None:
    # One stage loop: the turn detector is the pipeline's side stage, on the actor
    # machinery; the web layer never runs a stage or a worker thread itself.
    for path in sorted((REPO / "omnitrio" / "server").rglob("*.py")):
        used = _relative_imports(path) & {"_runner", "_worker", "_actor"}
        assert not used, f"{path.relative_to(REPO)} imports {used}"


def test_the_public_surface_is_exactly_all() -> None:
    import omnitrio

    assert sorted(omnitrio.__all__) == [
        "AudioChunk",
        "AudioInput",
        "ConfigError",
        "DEFAULT_CLIENT_CAPACITY",
        "DEFAULT_EDGE_CAPACITY",
        "EdgeSpec",
        "Event",
        "OmnitrioError",
        "Overloaded",
        "Pipeline",
        "PipelineClosed",
        "PipelineConfig",
        "PipelineSection",
        "PipelineStatistics",
        "Request",
        "Stage",
        "StageError",
        "StageLoadError",
        "StageSpec",
        "StageStatistics",
        "StepLimits",
        "Stream",
        "StreamOutput",
        "StreamResampler",
        "StreamStatistics",
        "StreamWork",
        "TextDelta",
        "VisibleItem",
        "load_config",
        "open_pipeline",
        "parse_config",
        "resample_float",
        "resample_pcm16",
    ]
    # Nothing public beyond __all__ but the subpackages (server, realtime, bench, tools).
    public = {
        name
        for name, value in vars(omnitrio).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(omnitrio.__all__)
    # The handle carries no runtime internals.
    handle = {n for n in dir(omnitrio.Stream) if not n.startswith("_")}
    assert handle == {"aclose", "failure", "id", "receive"}


def test_ray_is_imported_only_by_pipelines_that_place_a_stage_on_it() -> None:
    # Two modules speak to Ray (the stages' actors, the instance), and the runtime
    # imports them only for placement: ray.
    importers = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "omnitrio").rglob("*.py"))
        if "ray" in _imports(path)
    ]
    assert importers == ["omnitrio/_ray.py", "omnitrio/_ray_cluster.py"]
    code = (
        "import sys, omnitrio, omnitrio.server; "
        "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
