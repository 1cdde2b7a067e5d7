"""Docs that cannot rot: the Python API example and every snippet of docs/design.md run."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest
import trio

from tests.test_server_process import start_server
from tests.voice_support import missing_voice_parts

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
TEST_REF = re.compile(r"`(test_\w+\.py)?::(test_\w+)`")


def _load_example(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_python_api_example(capsys: pytest.CaptureFixture[str]) -> None:
    example = _load_example(REPO / "examples" / "python_api.py")
    with trio.fail_after(5):
        await example.main()
    text = " ".join(f"thinker:{i}" for i in range(1, 13))
    assert capsys.readouterr().out.splitlines() == [
        "pipeline 'example' ready: thinker -> talker -> code2wav",
        f"full stream: text {text!r}",
        "full stream: 3 audio chunks, 0.24 s of audio",
        "peeked stream: cancelled after 3 items",
        "statistics: 1 completed, 1 cancelled, 0 failed, 0 open; "
        "edge payloads that reached a client: 0",
    ]


def _python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block, in order."""
    source = path.read_text(encoding="utf-8")
    return [(source.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(source)]


async def test_design_doc_snippets_run() -> None:
    path = REPO / "docs" / "design.md"
    blocks = _python_blocks(path)
    assert blocks, f"{path} has no python blocks"
    namespace: dict[str, object] = {"__name__": "design_md"}
    for line, code in blocks:
        # Pad so tracebacks point at the line in design.md.
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
    coroutines = [
        value
        for value in namespace.values()
        if inspect.iscoroutinefunction(value) and value.__code__.co_filename == str(path)
    ]
    assert coroutines, "design.md defines no async snippet to run"
    for function in coroutines:  # in definition order
        with trio.fail_after(5):
            await function()


def test_design_doc_names_tests_that_exist() -> None:
    """``file.py::test_name`` (or ``::test_name``, same file as before) must name a real test."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    refs: list[tuple[str, str]] = []
    current = ""
    for match in TEST_REF.finditer(text):
        current = match.group(1) or current
        refs.append((current, match.group(2)))
    assert refs
    missing = [
        f"{file}::{name}"
        for file, name in refs
        if f"def {name}(" not in (REPO / "tests" / file).read_text(encoding="utf-8")
    ]
    assert missing == []


def test_readme_snippet_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plain (sync) test: the README's snippet calls trio.run itself.
    monkeypatch.chdir(REPO)
    blocks = [b for b in _python_blocks(REPO / "README.md") if "open_pipeline" in b[1]]
    assert len(blocks) == 1
    line, code = blocks[0]
    exec(compile("\n" * (line - 1) + code, str(REPO / "README.md"), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "TextDelta(text='thinker:1 ')" in out
    assert out.rstrip().endswith("1")


def test_readme_client_snippet_runs_against_the_server(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    blocks = [b for b in _python_blocks(REPO / "README.md") if "openai.OpenAI" in b[1]]
    assert len(blocks) == 1
    line, code = blocks[0]
    # Against the default pipeline (the voice chat) where its packages are installed.
    synthetic = ["--config", str(REPO / "configs" / "synthetic.yaml")]
    if not missing_voice_parts():
        request.getfixturevalue("voice_weights")
    process, url = start_server(*([] if not missing_voice_parts() else synthetic), "--port", "0")
    try:
        code = code.replace("http://127.0.0.1:8000", url)
        exec(compile("\n" * (line - 1) + code, str(REPO / "README.md"), "exec"), {})
    finally:
        process.terminate()
        process.communicate(timeout=10)
    assert capsys.readouterr().out.strip()  # the answer's text, streamed
