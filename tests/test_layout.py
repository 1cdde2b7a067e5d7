"""The layout shows the architecture: the runtime never imports torch, stages never import trio."""

from __future__ import annotations

import ast
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
