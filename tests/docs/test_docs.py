"""Docs that cannot rot: the Python API example, every snippet of docs/design.md and
docs/write-a-stage.md runs, and the README's commands are written as they run."""

from __future__ import annotations

import importlib.util
import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

from tests.server.test_server_process import start_server
from tests.voice_support import missing_voice_parts

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
ANY_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
FILE_NAME = re.compile(r"# ([\w.-]+\.(?:py|yaml))\n")
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


async def _run_snippets(path: Path, blocks: list[tuple[int, str]]) -> None:
    """Run ``blocks`` of ``path`` in one namespace, then each async function they define."""
    assert blocks, f"{path} has no python blocks"
    namespace: dict[str, object] = {"__name__": path.stem.replace("-", "_")}
    for line, code in blocks:
        # Pad so tracebacks point at the line in the doc.
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
    coroutines = [
        value
        for value in namespace.values()
        if inspect.iscoroutinefunction(value) and value.__code__.co_filename == str(path)
    ]
    assert coroutines, f"{path.name} defines no async snippet to run"
    for function in coroutines:  # in definition order
        with trio.fail_after(5):
            await function()


async def test_design_doc_snippets_run() -> None:
    path = REPO / "docs" / "design.md"
    await _run_snippets(path, _python_blocks(path))


async def test_write_a_stage_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The blocks that start with a file name ("# my_stages.py") are written out under
    # it, as a reader would save them; the other python blocks run in order, from that
    # folder, with it on the import path.
    path = REPO / "docs" / "write-a-stage.md"
    text = path.read_text(encoding="utf-8")
    files = []
    for match in ANY_FENCE.finditer(text):
        if named := FILE_NAME.match(match.group(2)):
            (tmp_path / named.group(1)).write_text(match.group(2), encoding="utf-8")
            files.append(named.group(1))
    assert files == ["my_stages.py", "my-pipeline.yaml"]
    blocks = [(line, code) for line, code in _python_blocks(path) if not FILE_NAME.match(code)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        await _run_snippets(path, blocks)
    finally:
        sys.modules.pop("my_stages", None)


def test_design_doc_names_tests_that_exist() -> None:
    """``file.py::test_name`` (or ``::test_name``, same file as before) must name a real test."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    refs: list[tuple[str, str]] = []
    current = ""
    for match in TEST_REF.finditer(text):
        current = match.group(1) or current
        refs.append((current, match.group(2)))
    assert refs
    # A file is named by its name alone: tests/test_layout.py holds names unique under tests/.
    found = {path.name: path for path in (REPO / "tests").rglob("test_*.py")}
    missing = [
        f"{file}::{name}"
        for file, name in refs
        if file not in found or f"def {name}(" not in found[file].read_text(encoding="utf-8")
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


# The README's commands: in ```sh blocks, and inline ones that take arguments.
README_INLINE = re.compile(r"`((?:\.venv/bin/|scripts/|omnitrio )[^`]*)`")


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    commands = [
        line.split("  #")[0].strip()
        for match in ANY_FENCE.finditer(text)
        if match.group(1) == "sh"
        for line in match.group(2).splitlines()
        if line.strip()
    ]
    commands += [m.group(1) for m in README_INLINE.finditer(text.replace("\n", " "))]
    return commands


def test_readme_commands_are_written_as_they_run_from_a_checkout() -> None:
    # After scripts/setup (or scripts/run), the omnitrio command is .venv/bin/omnitrio:
    # a bare `omnitrio prompt ...` would not be found on a fresh clone's PATH.
    commands = _readme_commands()
    assert len(commands) > 10
    bare = [c for c in commands if c.startswith("omnitrio ") and len(c.split()) > 2]
    assert bare == [], "write these as .venv/bin/omnitrio ..."
    for command in commands:
        program = shlex.split(command)[0]
        if program.startswith("scripts/") and not program.endswith("/"):  # not the folder
            assert (REPO / program).is_file(), command
            assert (REPO / program).stat().st_mode & 0o111, f"{program} is not executable"


def test_readme_omnitrio_commands_run(tmp_path: Path) -> None:
    # The quick ones, as written (with this interpreter's omnitrio in place of
    # .venv/bin/omnitrio): check-config and prompt.
    runs = [
        c
        for c in _readme_commands()
        if re.match(r"\.venv/bin/omnitrio (check-config configs/|prompt )", c)
    ]
    assert len(runs) == 2, runs
    for command in runs:
        if "voice-chat" in command and missing_voice_parts():
            continue  # its stage modules import the voice packages (skipped, as voice tests are)
        argv = [sys.executable, "-m", "omnitrio._cli", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command}: {done.stderr}"
