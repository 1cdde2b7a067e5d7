"""The sglang-omni baseline: its spec from omnitrio's configs, and the real peer at a
small scale (skipped, naming the setup command, where the peer's venv is absent)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.baselines import _sglang_omni
from benchmarks.baselines._sglang_omni import PeerUnavailable, open_sglang_omni, peer_python
from benchmarks.baselines._sglang_omni_spec import PeerConfigError, peer_spec
from benchmarks.harness._args import REPO
from benchmarks.harness._overrides import with_host_ms
from benchmarks.harness._runner import LoadSettings, run_load
from benchmarks.harness.cli import make_prompts
from omnitrio import load_config

QWEN3 = REPO / "configs" / "bench-qwen3-omni.yaml"
OMNI = REPO / "configs" / "bench-omni.yaml"


def test_the_spec_carries_the_workload_of_the_qwen3_omni_config() -> None:
    spec = peer_spec(with_host_ms(load_config(QWEN3), 4.0))
    thinker, talker, code2wav = spec["thinker"], spec["talker"], spec["code2wav"]
    assert thinker["step"]["service_ms"] == pytest.approx(6.0)
    assert thinker["step"]["per_stream_ms"] == pytest.approx(0.35)
    assert thinker["step"]["prefill_ms"] == pytest.approx(10.0)
    assert thinker["step"]["host_ms"] == pytest.approx(4.0)  # --host-ms reaches the peer
    assert thinker["max_running_requests"] == 32
    assert thinker["payload_bytes"] == 8192
    assert talker["frames_per_input"] == pytest.approx(3.5)
    assert talker["coalesce_frames"] == 25  # the talker coalesces a code2wav window
    assert code2wav["window"] == 25
    assert code2wav["max_replay_rows"] == 32
    assert code2wav["audio_samples"] == 48000  # one 2 s window a decode


def test_an_input_mode_code2wav_becomes_windows_of_its_inputs_per_step() -> None:
    code2wav = peer_spec(load_config(OMNI))["code2wav"]
    assert code2wav["window"] == 4
    assert code2wav["audio_samples"] == 1920  # 80 ms a window, as the stage shows it


def test_a_config_the_peer_cannot_run_is_refused_by_name() -> None:
    config = load_config(REPO / "configs" / "qwen3-omni-tiny.yaml")
    with pytest.raises(PeerConfigError, match="three synthetic stages"):
        peer_spec(config)


def test_a_missing_peer_environment_names_its_setup_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_sglang_omni, "PEER_VENV", tmp_path / "absent")
    with pytest.raises(PeerUnavailable, match="benchmarks/peers/sglang_omni/setup"):
        peer_python()


def _peer_missing() -> str | None:
    """Why the real peer cannot run here (its venv is absent), or None."""
    try:
        peer_python()
    except PeerUnavailable as exc:
        return str(exc)
    return None


PEER_MISSING = _peer_missing()


@pytest.mark.skipif(PEER_MISSING is not None, reason=PEER_MISSING or "")
async def test_the_real_peer_streams_every_token_and_window_of_each_request() -> None:
    config = load_config(QWEN3)
    steps, count = 16, 4
    prompts = make_prompts(count, 8, steps, seed=0)
    async with open_sglang_omni(config) as peer:
        assert peer.version == "0.1.9"
        assert "sglang.srt.platforms" in peer.standin
        assert "sglang-omni 0.1.9" in peer.peer_report()["package"]
        run = await run_load(peer, prompts, LoadSettings(max_concurrency=count, time_limit_s=60))
    assert not run.timed_out
    frames = math.ceil(steps * 3.5)  # 56 frames: two 25-frame windows and a remainder of 6
    for record in run.records:
        assert record.outcome == "completed", record.error
        assert record.num_text_deltas == steps
        assert len(record.audio) == math.ceil(frames / 25)
        assert record.audio_s == pytest.approx(3 * 2.0)
        # first audio after the first window's 25 frames: 8 tokens, 25 talker steps
        assert record.audio[0].at_s > 25 * 0.005
    assert any(s.rss_bytes for s in run.samples)
