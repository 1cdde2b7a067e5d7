"""The ``omnitrio`` command: a run on the default config, config checks, and Ctrl-C."""

from __future__ import annotations

import argparse
import re
import signal
from pathlib import Path

import pytest

import omnitrio
from omnitrio._cli import main
from tests.conftest import prompt_until_signal

REPO = Path(__file__).resolve().parents[2]


def test_run_on_the_default_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["prompt", "--streams", "2", "--prompt", "hello"]) == 0
    out = capsys.readouterr().out
    assert "pipeline 'synthetic-omni' ready: thinker -> talker -> code2wav" in out
    assert out.count("text: 'thinker:1 thinker:2") == 2
    assert "streams: 2 completed, 0 failed, 0 cancelled" in out


def test_check_config_reports_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: {name: x}\nstages: []\n")
    assert main(["check-config", str(bad)]) == 2
    assert f"omnitrio: {bad}: stages: needs at least 1 entry; add one" in capsys.readouterr().err
    assert main(["check-config", str(REPO / "configs" / "synthetic.yaml")]) == 0


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    # --help is read in a terminal: no reStructuredText (``code``, :class:) in it,
    # for the command or any subcommand.
    from omnitrio._cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {"omnitrio": parser.format_help()}
    helps |= {name: sub.format_help() for name, sub in commands.choices.items()}
    assert set(helps) >= {"omnitrio", "run", "prompt", "bench", "check-config"}
    for name, text in helps.items():
        assert "``" not in text, f"{name} --help:\n{text}"
        assert not re.search(r":(class|func|meth|mod|attr):", text), f"{name} --help:\n{text}"
    assert "omnitrio run" in helps["omnitrio"]  # the examples
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out == helps["omnitrio"]


def test_check_config_reports_every_problem_in_one_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "pipeline: {name: x, max_stream: 3}\n"
        "stages:\n"
        '  - {name: a, impl: "stages.synthetic:SyntheticStage", params: {step: 3}}\n'
        '  - {name: b, impl: "stages.nowhere:Stage"}\n'
        "edges:\n"
        "  - {from: a, to: b, capacity: 0}\n"
    )
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"omnitrio: {bad}: pipeline.max_stream: unknown key; remove it or fix its spelling",
        f"omnitrio: {bad}: edges[0].capacity: input should be greater than or equal to 1; "
        "fix the value",
        f"omnitrio: {bad}: stages[0].params.step: stages.synthetic:SyntheticStage has no "
        "parameter 'step'; known parameters: " + err[2].rpartition("known parameters: ")[2],
        f"omnitrio: {bad}: stages[1].impl: cannot import 'stages.nowhere' (No module named "
        "'stages.nowhere'); install it or fix the module path",
        f"omnitrio: 4 problems in {bad}",
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signals_stop_a_running_pipeline_cleanly(tmp_path: Path, signum: signal.Signals) -> None:
    config = tmp_path / "long.yaml"
    config.write_text(
        (REPO / "configs" / "synthetic.yaml").read_text().replace("steps: 24", "steps: 100000")
    )
    stopped = prompt_until_signal(config, signum)
    assert stopped.returncode == 128 + signum, stopped.stderr
    assert f"{signum.name}; pipeline stopped" in stopped.stderr
    assert stopped.exit_s < 5


def test_ray_address_applies_to_pipelines_with_ray_stages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from omnitrio._overrides import with_ray_address

    ray = omnitrio.load_config(REPO / "configs" / "synthetic-ray.yaml")
    assert with_ray_address(ray, "10.0.0.1:6379").pipeline.ray_address == "10.0.0.1:6379"
    thread = REPO / "configs" / "synthetic.yaml"
    assert main(["prompt", "--config", str(thread), "--ray-address", "10.0.0.1:6379"]) == 2
    assert (
        f"omnitrio: {thread}: --ray-address: no stage of pipeline 'synthetic-omni' has "
        "placement: ray" in capsys.readouterr().err
    )


def test_model_path_names_one_stage_or_goes_to_one_checkpoint(tmp_path: Path) -> None:
    from omnitrio._overrides import with_model_path_arg

    voice = omnitrio.load_config(REPO / "configs" / "voice-chat.yaml")
    folder = tmp_path / "smollm2-360m"
    folder.mkdir()
    params = {s.name: s.params for s in with_model_path_arg(voice, f"llm={folder}").stages}
    assert params["llm"]["model_path"] == str(folder)
    assert "model_path" not in params["asr"]  # Moonshine reads its packaged weights
    # Only the LLM takes a model_path in the voice chat: a bare folder goes to it.
    bare = {s.name: s.params for s in with_model_path_arg(voice, str(folder)).stages}
    assert bare["llm"]["model_path"] == str(folder)
    # The Qwen-Omni stages declare one checkpoint: one folder serves them all.
    qwen = omnitrio.load_config(REPO / "configs" / "qwen3-omni-tiny.yaml")
    paths = {s.params.get("model_path") for s in with_model_path_arg(qwen, str(folder)).stages}
    assert paths == {str(folder)}
