"""``omnitrio bench`` end to end on a fast synthetic pipeline: it runs and reports (no timing
thresholds: the machines are shared, so performance is measured by the benchmark, not here)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from omnitrio._cli import main
from tests.server.test_server_process import _signal_and_wait, start_server

REPO = Path(__file__).resolve().parents[3]

FAST = """
pipeline: {name: bench-smoke, max_streams: 8}
stages:
  - name: thinker
    impl: stages.synthetic:SyntheticStage
    params: {steps: 64, payload_bytes: 256, prefill_ms: 1.0, service_time_ms: 0.5}
  - name: talker
    impl: stages.synthetic:SyntheticStage
    params: {visible_every: 0, service_time_ms: 0.5}
  - name: code2wav
    impl: stages.synthetic:SyntheticStage
    params:
      inputs_per_step: 4
      outputs_per_input: 0
      visible_every: 4
      visible: audio
      audio_samples: 480
      sample_rate_hz: 24000
      service_time_ms: 0.5
edges:
  - {from: thinker, to: talker}
  - {from: talker, to: code2wav}
"""


@pytest.fixture
def fast_config(tmp_path: Path) -> Path:
    path = tmp_path / "fast.yaml"
    path.write_text(FAST)
    return path


def run_bench(tmp_path: Path, *args: str) -> tuple[dict[str, object], str]:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    code = main(
        [
            "--log-level",
            "WARNING",
            "bench",
            "--num-prompts",
            "4",
            "--output-len",
            "8",
            "--input-len",
            "4",
            "--time-limit-s",
            "60",
            "--no-progress",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
            *args,
        ]
    )
    assert code == 0
    return json.loads(out_json.read_text()), out_md.read_text()


def check_runs(report: dict[str, object], targets: list[str], levels: list[int]) -> None:
    runs = report["runs"]
    assert isinstance(runs, list)
    assert [(r["target"], r["max_concurrency"]) for r in runs] == [
        (t, level) for level in levels for t in targets
    ]
    for run in runs:
        requests = run["requests"]
        assert len([r for r in requests if not r["warmup"]]) == 4, run["target"]
        for record in requests:
            assert record["outcome"] == "completed", (run["target"], record)
            assert len(record["text_at_s"]) == 8  # one text delta per token
            assert len(record["audio"]) == 2  # a window of 4 frames per chunk
        aggregates = run["aggregates"]
        assert aggregates["num_completed"] == 4
        assert aggregates["ttfa_s"]["count"] == 4
        assert aggregates["throughput"]["requests_per_s"] > 0


def test_bench_in_process_with_the_built_in_baselines(tmp_path: Path, fast_config: Path) -> None:
    report, markdown = run_bench(
        tmp_path,
        "--config",
        str(fast_config),
        "--sweep",
        "1,2",
        "--baseline",
        "orchestrator-shape",
        "--baseline",
        "vllm-omni-model",
        "--baseline",
        "sequential",
        "--warmup",
        "1",
        "--set",
        "talker.service_time_ms=0.25",
    )
    check_runs(report, ["omnitrio", "orchestrator-shape", "vllm-omni-model", "sequential"], [1, 2])
    workload = report["workload"]
    assert isinstance(workload, dict)
    assert set(workload["ideal_ttfa_s"]) == {"1", "2"}  # JSON keys
    assert "| omnitrio | c=1 | 0 |" in markdown
    assert "## omnitrio / baseline" in markdown
    assert "| vllm-omni-model | c=2 | 0 |" in markdown


def test_bench_plots(tmp_path: Path, fast_config: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is in the optional bench extra")
    report, _ = run_bench(
        tmp_path, "--config", str(fast_config), "--sweep", "1,2", "--plots", str(tmp_path / "p")
    )
    check_runs(report, ["omnitrio"], [1, 2])
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "audio_chunk_timeline.png",
        "ttfa_per_wave.png",
        "ttfa_throughput_vs_concurrency.png",
    ]


def test_bench_open_loop_with_repetitions_and_the_semaphore_variant(
    tmp_path: Path, fast_config: Path
) -> None:
    report, markdown = run_bench(
        tmp_path,
        *("--config", str(fast_config), "--load-fractions", "0.001", "--repeat", "2"),
        *("--baseline", "vllm-omni-model-sem512", "--plots", str(tmp_path / "p")),
    )
    runs = report["runs"]
    assert isinstance(runs, list)
    assert [(r["target"], r["repetition"]) for r in runs] == [
        ("omnitrio", 0),
        ("vllm-omni-model-sem512", 0),
        ("omnitrio", 1),
        ("vllm-omni-model-sem512", 1),
    ]
    workload = report["workload"]
    assert isinstance(workload, dict)
    rate = workload["open_loop_requests_per_s"]["0.001"]
    assert rate == pytest.approx(0.001 * workload["capacity_requests_per_s"])
    for run in runs:
        assert run["request_rate"] == pytest.approx(rate)
        assert run["aggregates"]["num_completed"] == 4, run["target"]
    assert "| vllm-omni-model-sem512 | " in markdown
    if (tmp_path / "p").exists():  # matplotlib installed
        assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["open_loop.png"]


def test_bench_with_the_pipecat_baseline(tmp_path: Path, fast_config: Path) -> None:
    pytest.importorskip("pipecat", reason="pipecat-ai is in the optional bench extra")
    report, _ = run_bench(tmp_path, "--config", str(fast_config), "--baseline", "pipecat")
    check_runs(report, ["omnitrio", "pipecat"], [4])


@pytest.mark.parametrize(
    ("api", "framing", "name"),
    [
        ("realtime", "msgpack", "omnitrio-realtime-msgpack"),
        ("realtime", "json", "omnitrio-realtime-json"),
        ("chat", "json", "omnitrio-chat-sse"),
    ],
)
def test_bench_against_a_running_server(
    tmp_path: Path, fast_config: Path, api: str, framing: str, name: str
) -> None:
    process, url = start_server("--config", str(fast_config), "--port", "0")
    try:
        report, _ = run_bench(
            tmp_path,
            *("--url", url, "--config", str(fast_config), "--api", api, "--framing", framing),
            *("--max-concurrency", "2"),
        )
    finally:
        _signal_and_wait(process, signal.SIGTERM)
    check_runs(report, [name], [2])
    samples = report["runs"][0]["samples"]  # type: ignore[index]
    assert samples, "the server's /metrics was sampled"
    assert samples[-1]["rss_bytes"] > 0


def test_bench_refuses_a_remote_url_unless_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", "http://192.0.2.1:8000", "--no-progress"]) == 2
    assert "not a loopback address; pass --allow-remote" in capsys.readouterr().err
    assert main(["bench", "--url", "http://127.0.0.1:1", "--no-progress"]) == 2
    assert "no omnitrio server at 127.0.0.1:1" in capsys.readouterr().err


def test_bench_baselines_only_runs_the_baselines_alone(
    tmp_path: Path, fast_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, _ = run_bench(
        tmp_path,
        *("--config", str(fast_config), "--baselines-only", "--baseline", "vllm-omni-model"),
    )
    check_runs(report, ["vllm-omni-model"], [4])
    assert main(["bench", "--baselines-only", "--no-progress"]) == 2
    assert "--baselines-only needs at least one --baseline" in capsys.readouterr().err


def test_bench_set_names_a_stage_parameter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--set", "nobody.x=1", "--no-progress"]) == 2
    assert "give STAGE.PARAM=VALUE with a stage of the config" in capsys.readouterr().err
    assert main(["bench", "--set", "thinker.nope=1", "--no-progress"]) == 2
    assert "has no parameter 'nope'" in capsys.readouterr().err


def test_bench_tiny_qwen3_omni_against_monolithic_generate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="the model stages need the models extra")
    import tqdm

    from stages.qwen3_omni.tiny import make_tiny_checkpoint

    # transformers' "Loading weights" bars would start tqdm's monitor thread, which
    # outlives the test (the leak check counts it); the bars work without it.
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)

    make_tiny_checkpoint(tmp_path / "tiny")
    report, markdown = run_bench(
        tmp_path,
        *("--config", str(REPO / "configs" / "qwen3-omni-tiny.yaml")),
        *("--model-path", str(tmp_path / "tiny")),
        *("--monolithic", "stages.qwen3_omni.reference:monolithic", "--max-concurrency", "2"),
        *("--option", "temperature=0", "--option", "talker.temperature=0"),
        *("--option", "talker.max_tokens=8"),
    )
    runs = report["runs"]
    assert isinstance(runs, list)
    assert [r["target"] for r in runs] == [
        "omnitrio",
        "monolithic:stages.qwen3_omni.reference:monolithic",
    ]
    for run in runs:
        assert run["aggregates"]["num_completed"] == 4, run["target"]
        assert run["aggregates"]["ttfa_s"]["count"] == 4, run["target"]
    assert "## omnitrio / baseline" in markdown


def test_bench_sweeps_host_time_for_every_target_alike(tmp_path: Path, fast_config: Path) -> None:
    report, markdown = run_bench(
        tmp_path,
        *("--config", str(fast_config), "--max-concurrency", "2", "--host-ms", "0,0.5"),
        *("--baseline", "vllm-omni-model"),
    )
    check_runs(
        report,
        [
            "omnitrio host=0ms",
            "vllm-omni-model host=0ms",
            "omnitrio host=0.5ms",
            "vllm-omni-model host=0.5ms",
        ],
        [2],
    )
    runs = report["runs"]
    assert isinstance(runs, list)
    # Each host time has its own zero-overhead path: 4 steps of 0.5 ms more to the first audio.
    added = [run["aggregates"]["runtime_added_ttfa_s"]["min"] for run in runs]
    assert all(value > -0.001 for value in added), added
    assert "## omnitrio host=0ms / baseline over the repetitions" in markdown
    assert "| vllm-omni-model host=0.5ms | c=2 | " in markdown


QWEN3_OMNI_SHAPED = FAST.replace(
    "params: {visible_every: 0, service_time_ms: 0.5}",
    "params: {visible_every: 0, service_time_ms: 0.5, frames_per_input: 2.5, host_ms: 0.2}",
).replace("      visible_every: 4\n", "      visible_every: 1\n      window: 4\n")


def test_todays_vllm_omni_and_the_talker_shape_end_to_end(tmp_path: Path) -> None:
    config = tmp_path / "shaped.yaml"
    config.write_text(QWEN3_OMNI_SHAPED)
    report, markdown = run_bench(
        tmp_path,
        *("--config", str(config), "--max-concurrency", "2"),
        *("--baseline", "vllm-omni-model-today", "--baseline", "vllm-omni-model"),
    )
    runs = report["runs"]
    assert isinstance(runs, list)
    assert [r["target"] for r in runs] == [
        "omnitrio",
        "vllm-omni-model-today",
        "vllm-omni-model",
    ]
    for run in runs:
        for record in run["requests"]:
            assert record["outcome"] == "completed", (run["target"], record)
            assert len(record["text_at_s"]) == 8
            # 8 tokens x 2.5 frames = 20 frames: 5 windows of 4, one audio chunk each.
            assert len(record["audio"]) == 5, run["target"]
    assert "| vllm-omni-model-today | c=2 | 0 |" in markdown


def test_the_runtime_command_line_hands_bench_its_arguments(tmp_path: Path) -> None:
    # `python -m omnitrio bench --help`: the runtime's CLI lists the command and passes
    # what follows it to the harness (benchmarks/harness), whose parser lists every flag.
    # Run from outside the checkout: the wheel leaves benchmarks/ out, so the CLI finds the
    # harness in the checkout it was installed from (editable), not on the working directory.
    done = subprocess.run(
        [sys.executable, "-m", "omnitrio", "--log-level", "WARNING", "bench", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith("usage: omnitrio bench")
    assert "``" not in done.stdout  # plain text, as every --help (tests/runtime/test_cli.py)
    for flag in ("--baseline", "--sweep", "--host-ms", "--placement", "--json", "--plots"):
        assert flag in done.stdout


def test_bench_without_the_harness_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An install without the repository's `benchmarks` package: a clear refusal, exit 2.
    # (The harness's modules are put back as they were, for the tests that follow.)
    harness = {m: module for m, module in sys.modules.items() if m.split(".")[0] == "benchmarks"}
    try:
        for name in harness:
            del sys.modules[name]
        sys.modules["benchmarks"] = None  # type: ignore[assignment]
        assert main(["bench", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "bench needs the benchmark harness, the `benchmarks` folder" in err
        # A harness whose own dependency is missing names it and the extra to install.
        del sys.modules["benchmarks"]
        monkeypatch.setitem(sys.modules, "yaml", None)
        assert main(["bench", "--no-progress"]) == 2
        assert "bench needs 'yaml', which is not installed" in capsys.readouterr().err
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "benchmarks"]:
            del sys.modules[name]
        sys.modules.update(harness)
