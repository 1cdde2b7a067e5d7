"""The layout shows the architecture: the runtime never imports torch, stages never import trio,
measurement code lives in benchmarks/ on omnitrio's public API, and the tests mirror the code."""

from __future__ import annotations

import ast
import re
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


def test_the_runtime_and_its_command_line_load_no_torch() -> None:
    code = (
        "import sys, omnitrio, omnitrio._cli, omnitrio.server, omnitrio.realtime; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# Tests mirror the code: each folder of tests/ holds the tests of one folder of the
# repository, so a module's tests are found by its path (omnitrio/server/_app.py's in
# tests/server/). tests/ itself holds only what every folder shares (conftest.py, the
# *_support.py helpers) and this file, which is about the whole tree.
MIRROR = {
    "runtime": "omnitrio",
    "runtime/admission": "omnitrio/admission",  # admission and headroom, one room
    "server": "omnitrio/server",
    "realtime": "omnitrio/realtime",
    "webrtc": "omnitrio/webrtc",
    "stages": "stages",
    "stages/qwen2_5_omni": "stages/qwen2_5_omni",
    "stages/qwen3_omni": "stages/qwen3_omni",
    "stages/voice": "stages/voice",
    "web": "web",
    "benchmarks": "benchmarks",
    "benchmarks/harness": "benchmarks/harness",
    "benchmarks/baselines": "benchmarks/baselines",
    "benchmarks/reliability": "benchmarks/reliability",
    "docs": "docs",
}


PEERS = REPO / "benchmarks" / "peers"


def test_tests_mirror_the_code() -> None:
    tests = REPO / "tests"
    test_files = sorted(tests.rglob("test_*.py"))
    assert len(test_files) > 40  # the suite, not an empty glob
    for path in test_files:
        folder = path.parent.relative_to(tests).as_posix()
        if folder == ".":
            assert path.name == "test_layout.py", (
                f"{path.name}: move it into the folder of its code"
            )
            continue
        assert folder in MIRROR, f"tests/{folder}/ mirrors no folder of the code (see MIRROR)"
    # Every folder of tests/ is a package (unique module names) and mirrors a real folder.
    for folder, source in MIRROR.items():
        assert (REPO / source).is_dir(), f"tests/{folder}/ mirrors {source}/, which is gone"
        assert (tests / folder / "__init__.py").is_file(), f"tests/{folder}/ is not a package"
    # Every code package of the runtime, of stages/ and of benchmarks/ has its tests folder.
    for init in sorted(
        init
        for top in ("omnitrio", "stages", "benchmarks")
        for init in (REPO / top).rglob("__init__.py")
        # a benchmark peer's code runs in the peer's own venv (benchmarks/peers/*/setup)
        if PEERS not in init.parents
    ):
        source = init.parent.relative_to(REPO).as_posix()
        assert source in MIRROR.values(), f"{source}/ has no tests folder in MIRROR"
    # A test file is named alone (docs/design.md names tests as `file.py::test`).
    names = [path.name for path in test_files]
    assert len(names) == len(set(names)), "two test files share a name"


# What a stage's module may import from the project: omnitrio's public names (the
# package and its public tools module; nothing of the Realtime protocol, the server or
# a private module) and the stage kit; a family's modules import each other relatively.
STAGE_IMPORTS = {"omnitrio", "omnitrio.tools", "stages.kit"}


def _project_imports(path: Path) -> tuple[set[str], set[int]]:
    """The absolute imports of omnitrio or stages modules in ``path``, and the levels of
    its relative imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    absolute: set[str] = set()
    levels: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            absolute.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                levels.add(node.level)
            elif node.module:
                absolute.add(node.module)
    return {m for m in absolute if m.split(".")[0] in {"omnitrio", "stages"}}, levels


def test_a_stage_imports_only_the_kit_and_omnitrio_public_names() -> None:
    # The kit (stages/kit.py) and its private modules are the one door to stages/_*.
    kit = {"kit.py", *(p.name for p in (REPO / "stages").glob("_*.py"))}
    checked = 0
    for path in sorted((REPO / "stages").rglob("*.py")):
        if path.parent == REPO / "stages" and path.name in kit:
            continue
        absolute, levels = _project_imports(path)
        where = path.relative_to(REPO)
        assert absolute <= STAGE_IMPORTS, f"{where} imports {absolute - STAGE_IMPORTS}"
        assert levels <= {1}, f"{where} reaches outside its family by a relative import"
        checked += 1
    assert checked > 30


def test_every_model_family_has_the_one_layout() -> None:
    # A family (stages/<family>/): __init__.py holds its docstring and its name (FAMILY)
    # only; its modules are public, one per stage named for the stage's role, the
    # stage's class named <Model><Role> (thinker.py: Qwen3OmniThinker; asr.py:
    # WhisperAsr); payloads.py holds what its stages send one another.
    families = sorted(p.parent for p in (REPO / "stages").glob("*/__init__.py"))
    assert [f.name for f in families] == ["qwen2_5_omni", "qwen3_omni", "voice"]
    stages_found = 0
    for family in families:
        init = ast.parse((family / "__init__.py").read_text())
        body = init.body
        assert isinstance(body[0], ast.Expr), f"{family.name}/__init__.py has no docstring"
        assert [ast.unparse(n).split(" =")[0] for n in body[1:]] == ["FAMILY"], (
            f"{family.name}/__init__.py holds more than its docstring and FAMILY"
        )
        modules = sorted(p for p in family.glob("*.py") if p.name != "__init__.py")
        private = [p.name for p in modules if p.name.startswith("_")]
        assert not private, f"{family.name}: private modules {private}; make them public"
        assert (family / "payloads.py").is_file(), f"{family.name} has no payloads.py"
        for module in modules:
            for node in ast.parse(module.read_text()).body:
                if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                    continue
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                bases = {ast.unparse(b) for b in node.bases}
                if "step" in methods or any(b.endswith("Stage") for b in bases):
                    stages_found += 1
                    role = module.stem.replace("_", "").lower()
                    assert node.name.lower().endswith(role), (
                        f"{family.name}/{module.name}: stage class {node.name} is not "
                        f"<Model>{module.stem.title()}"
                    )
    assert stages_found >= 11  # the families' stage classes, found


# docs/glossary.md, "One name per concept": the retired names, as identifiers (a class,
# function, attribute, argument or variable), anywhere in the code, the tests and the
# scripts. Prose may still say what a thing is used for ("turn detection").
RETIRED_NAMES = {
    "TurnDetector": "SideStage",  # the side stage
    "DetectorStream": "SessionSideStream",
    "Listener": "TurnDetectionState",
    "ListenAudio": "SideStageAudio",
    "Limits": "StepLimits",  # one limits type
    "has_outbox": "feeds_edge",  # outbox is stages.kit.Outbox
    "max_batch_size_seen": "largest_batch_size",  # the largest batch seen
    "_StreamState": "_Stream",  # per-stream state in stages
    "_Turn": "_Stream",
    "_Track": "_Stream",
    "_Speech": "_Stream",
}
# In stages/ only: a stage's per-stream state is self.streams.
RETIRED_IN_STAGES = {"_streams", "_tracks", "_speech", "_audio"}


def _identifiers(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names.add(node.arg)
    return names


def test_one_name_per_concept() -> None:
    checked = 0
    for folder in ("omnitrio", "stages", "tests", "benchmarks", "examples"):
        for path in sorted((REPO / folder).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where == "tests/test_layout.py":
                continue
            found = _identifiers(ast.parse(path.read_text(), filename=where))
            for name in sorted(found & RETIRED_NAMES.keys()):
                raise AssertionError(
                    f"{where} uses {name!r}: its name is {RETIRED_NAMES[name]} (docs/glossary.md)"
                )
            if folder == "stages" and found & RETIRED_IN_STAGES:
                raise AssertionError(
                    f"{where} keeps per-stream state in {found & RETIRED_IN_STAGES}: "
                    "call it self.streams (docs/glossary.md)"
                )
            checked += 1
    assert checked > 100
    # The statistic and the config: no field of the retired names.
    import omnitrio
    from omnitrio._stage import StepLimits

    assert "largest_batch_size" in omnitrio.StageStatistics.__dataclass_fields__
    assert "max_batch_size" not in omnitrio.StageStatistics.__dataclass_fields__
    assert "side_stage" in omnitrio.PipelineConfig.model_fields
    assert "turn_detection" not in omnitrio.PipelineConfig.model_fields
    assert "max_inputs_per_step" in StepLimits.__dataclass_fields__
    from omnitrio.server._state import ServerState

    assert "side_stage" in ServerState.__dataclass_fields__
    assert "turns" not in ServerState.__dataclass_fields__
    for config in sorted((REPO / "configs").glob("*.yaml")):
        assert not re.search(r"^turn_detection:", config.read_text(), re.M), config.name


# The calls that wait by the clock: time.sleep, trio.sleep, asyncio.sleep, anyio.sleep and
# their sleep_until, by attribute or by a name imported from those modules (aliases too).
# trio.sleep_forever waits to be cancelled, not for time to pass, so it is allowed.
_CLOCK_WAITS = {"sleep", "sleep_until"}
_CLOCK_MODULES = {"time", "trio", "asyncio", "anyio"}


def _clock_waits(source: str, filename: str = "<source>") -> list[int]:
    """The lines of ``source`` that call a sleep: parsed, so comments and strings that
    mention one do not count and an aliased import (``from time import sleep as nap``)
    does."""
    tree = ast.parse(source, filename=filename)
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in _CLOCK_MODULES
        for alias in node.names
        if alias.name in _CLOCK_WAITS
    }
    modules = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name in _CLOCK_MODULES
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        by_name = isinstance(func, ast.Name) and func.id in aliases
        by_module = (
            isinstance(func, ast.Attribute)
            and func.attr in _CLOCK_WAITS
            and isinstance(func.value, ast.Name)
            and func.value.id in modules
        )
        if by_name or by_module:
            lines.append(node.lineno)
    return sorted(lines)


def test_the_sleep_finder_finds_sleeps_and_only_sleeps() -> None:
    # The check below can fail for what it claims: every way of sleeping is found ...
    assert _clock_waits("import time\ntime.sleep(0.1)\n") == [2]
    assert _clock_waits("import trio\nasync def f():\n    await trio.sleep(1)\n") == [3]
    assert _clock_waits("import trio as t\nasync def f():\n    await t.sleep_until(5)\n") == [3]
    assert _clock_waits("from time import sleep as nap\nnap(1)\n") == [2]
    assert _clock_waits("from asyncio import sleep\nasync def f():\n    await sleep(0)\n") == [3]
    # ... and what merely mentions one, or waits to be cancelled, is not.
    assert _clock_waits("# no time.sleep(1) here\nx = 'trio.sleep(2)'\n") == []
    assert _clock_waits("import trio\nasync def f():\n    await trio.sleep_forever()\n") == []
    assert _clock_waits("def sleep(x):\n    return x\nsleep(1)\n") == []


def test_no_sleeping_in_the_runtime() -> None:
    # Waiting is always on an event or a channel: no sleep anywhere in the runtime.
    # (benchmarks/ is apart from it: its load generator paces arrivals on a clock, and its
    # orchestrator-shape and vllm-omni-model baselines poll on purpose, as the designs
    # they model do.)
    checked = 0
    for path in sorted((REPO / "omnitrio").rglob("*.py")):
        lines = _clock_waits(path.read_text(), str(path))
        assert not lines, f"{path.relative_to(REPO)} sleeps on lines {lines}"
        checked += 1
    assert checked > 40  # the runtime's modules, not an empty glob


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, anywhere in it (a deferred
    import inside a function makes a circle too, only a later-found one)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name`, the module.
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_omnitrio() -> None:
    # A module that needs another's function while that one imports it back is two
    # modules that are one: the shared part goes to a third module both import.
    # omnitrio/__init__.py re-exports the public names; a submodule importing from a
    # sibling does not go through it, so the package itself counts as a module here.
    paths = sorted((REPO / "omnitrio").rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph = {_module_name(p): _imported_modules(p, modules) for p in paths}
    assert graph["omnitrio._cli"]  # the parse found edges
    assert _cycles(graph) == []


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
        loop = {"_runner", "_worker", "_actor", "_actor_base", "_actor_plan", "_actor_apply"}
        used = _relative_imports(path) & loop
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
        "ResponseOptions",
        "Scalar",
        "Stage",
        "StageError",
        "StageLoadError",
        "StageSpec",
        "StageStatistics",
        "StepCost",
        "StepLimits",
        "Stream",
        "StreamOutput",
        "StreamResampler",
        "StreamShed",
        "StreamStatistics",
        "StreamWork",
        "TextDelta",
        "VisibleItem",
        "load_config",
        "open_pipeline",
        "parse_config",
        "resample_float",
        "resample_pcm16",
        "resolve_impl",
        "trim_heap",
        "with_model_path",
    ]
    # Nothing public beyond __all__ but the subpackages (server, realtime, tools).
    public = {
        name
        for name, value in vars(omnitrio).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(omnitrio.__all__)
    # The handle carries no runtime internals.
    handle = {n for n in dir(omnitrio.Stream) if not n.startswith("_")}
    assert handle == {"aclose", "failure", "id", "receive"}


def test_the_benchmark_harness_is_apart_from_the_runtime() -> None:
    # All measurement code lives in benchmarks/ (the `omnitrio bench` harness, its
    # baselines, the scripts, the reliability tools), not in the runtime package. The one
    # door from the runtime is `omnitrio bench`: the CLI imports the harness's entry
    # point inside a function, when the command runs; nothing else of omnitrio/ does.
    importers = {}
    for path in sorted((REPO / "omnitrio").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            for name in names:
                if name.split(".")[0] == "benchmarks":
                    where = path.relative_to(REPO).as_posix()
                    importers[where] = (name, node.col_offset)
    # The CLI's import is indented: inside a function, so only `bench` loads it.
    assert list(importers) == ["omnitrio/_cli.py"], importers
    name, column = importers["omnitrio/_cli.py"]
    assert name == "benchmarks.harness"
    assert column > 0
    code = (
        "import sys, omnitrio, omnitrio._cli, omnitrio.server; "
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'benchmarks']; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# What benchmarks/ may import of omnitrio: its public names (the package, `server`,
# `realtime`, `tools`), as any user of the runtime would. The one exception is named
# with its reason.
BENCHMARK_PRIVATE_IMPORTS = {
    # The micro-benchmark measures the floor of a stage's worker-thread crossing, the
    # runtime's own WorkerThread: an internal by nature, not a user's API.
    ("benchmarks/runtime_micro.py", "omnitrio._worker"),
    # What the upload trust boundary costs a request: its decoder processes against the
    # same decode in process, internals by nature (issue 42).
    ("benchmarks/reliability/boundary_costs.py", "omnitrio.server._audio_gate"),
    ("benchmarks/reliability/boundary_costs.py", "omnitrio.server._decoders"),
}


def test_benchmarks_use_only_omnitrio_public_api() -> None:
    private = set()
    checked = 0
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        absolute, _ = _project_imports(path)
        for module in absolute:
            if any(part.startswith("_") for part in module.split(".")[1:]):
                private.add((where, module))
        checked += 1
    assert checked > 30  # the harness, the baselines, the scripts and the tools
    assert private == BENCHMARK_PRIVATE_IMPORTS, private - BENCHMARK_PRIVATE_IMPORTS


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


# Small files with one job (the house style: ~300 lines a module). A voice stage module
# past this has more than one job: split it by job, as the TTS (tts.py: the step;
# tts_schedule.py, tts_synthesis.py) and the LLM (llm.py: the step; llm_prompt.py,
# llm_answer.py, llm_engines.py, llm_fast_answers.py) were.
MAX_VOICE_MODULE_LINES = 450


def test_no_voice_stage_module_holds_more_than_one_jobs_lines() -> None:
    sizes = {
        path.name: len(path.read_text().splitlines())
        for path in sorted((REPO / "stages" / "voice").glob("*.py"))
    }
    assert len(sizes) > 20
    assert sizes["tts.py"] <= 350
    assert sizes["llm.py"] <= 350
    over = {name: n for name, n in sizes.items() if n > MAX_VOICE_MODULE_LINES}
    assert not over, f"split these by job: {over}"


# The pipeline's supervisor was one module of 604 lines; it is split by job (the
# ``Pipeline`` and ``open_pipeline``; start-up and process-wide policies; statistics;
# the side stage's streams) and each part held to the house size.
MAX_PIPELINE_MODULE_LINES = 350


def test_the_pipeline_modules_stay_split_by_job() -> None:
    names = ["_pipeline.py", "_pipeline_start.py", "_pipeline_statistics.py", "_side_stream.py"]
    sizes = {name: len((REPO / "omnitrio" / name).read_text().splitlines()) for name in names}
    over = {name: n for name, n in sizes.items() if n > MAX_PIPELINE_MODULE_LINES}
    assert not over, f"split these by job: {over}"
