"""benchmarks/host_floor.py: the first audio's path at one stream, built with no omnitrio."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import yaml

import omnitrio
from benchmarks.host_floor import PathShape, Summary, path_shape, run_path

BENCH_OMNI = Path(__file__).resolve().parents[2] / "configs" / "bench-omni.yaml"


def test_the_path_is_the_benchs_six_steps() -> None:
    """bench-omni.yaml at one stream, 32 words: the prefill (20 + 32 x 0.05 ms) and the
    first token (8 + 0.15), three tokens more, the talker's fourth frame (6 + 0.1) and
    code2wav's fourth window (4 + 0.05): 64.35 ms, the bench's own ideal."""
    shape = path_shape(omnitrio.load_config(BENCH_OMNI), num_words=32, tokens=32)
    assert shape.thinker_first_s == pytest.approx(0.02975)
    assert (shape.thinker_s, shape.talker_s, shape.code2wav_s) == pytest.approx(
        (0.00815, 0.0061, 0.00405)
    )
    assert shape.ideal_s == pytest.approx(0.06435)
    assert shape.path_s() == pytest.approx(shape.ideal_s)


def test_a_chain_of_another_shape_is_refused() -> None:
    text = BENCH_OMNI.read_text().replace("inputs_per_step: 4", "window: 4")
    with pytest.raises(ValueError, match="once per input"):
        path_shape(omnitrio.parse_config(yaml.safe_load(text)), num_words=32, tokens=32)


def test_the_first_audio_waits_for_the_whole_path() -> None:
    """Each request's first audio comes after its six steps (never sooner: a token
    routed past a stage would be), and every token reaches code2wav."""
    shape = PathShape(0.004, 0.002, 0.0015, 0.001, 0.0125)
    requests = trio.run(run_path, shape, 3, 6)
    assert len(requests) == 3
    for r in requests:
        assert r.first_audio_s - r.sent_s >= shape.path_s()
        assert (r.frames, r.windows) == (6, 6)
        assert r.path_late_s >= 0


def test_summary_percentiles_in_microseconds() -> None:
    s = Summary.of([i / 1e6 for i in range(1, 101)])
    assert (s.n, s.p50, s.p99) == (100, pytest.approx(50.5), pytest.approx(99.0))
