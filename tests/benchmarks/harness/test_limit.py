"""``omnitrio bench --find-limit``: the sweep runs on a real pipeline and reports the
true limit against headroom (no timing thresholds: the figures are the benchmark's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness._limit import CapRun, below, buffered_stall_s, limit_table, true_limit
from benchmarks.harness._record import AudioArrival
from benchmarks.harness._runner import LoadSettings, retry_delay_s
from benchmarks.harness._target import Refused
from omnitrio._cli import main
from tests.benchmarks.harness.test_bench_smoke import FAST


def _run(cap: int, admission: str, *, failed: int = 0, continuity: float | None = 1.0) -> CapRun:
    return CapRun(cap, admission, 4 - failed, failed, 0, continuity, 1.0, None, None)


def test_the_true_limit_is_the_largest_cap_that_kept_every_stream_continuous() -> None:
    runs = [
        _run(2, "max_streams"),
        _run(4, "max_streams"),
        _run(6, "max_streams", continuity=0.75),  # one stream ran dry
        _run(8, "max_streams", failed=1),
        _run(8, "headroom"),  # headroom's own run never sets the limit
    ]
    assert true_limit(runs) == 4
    assert true_limit(runs[2:]) is None


def test_where_every_cap_given_fails_in_open_loop_lower_caps_are_searched() -> None:
    """``bench-omni.yaml``'s open loop at 128.7 arrivals/s: no cap of 56-80 kept every
    stream continuous by both rules, so the sweep named no limit."""

    def open_run(cap: int, continuity: float) -> CapRun:
        return CapRun(cap, "max_streams", 10, 0, 5, continuity, 1.0, None, None, 1.0, 9.0)

    runs = [open_run(cap, 0.9) for cap in (56, 64, 72, 80)]
    caps = [56, 64, 72, 80]
    assert below(runs, caps) == 42  # down by a quarter
    runs.append(open_run(42, 0.95))
    assert below(runs, caps) == 31
    runs.append(open_run(31, 1.0))  # held: then halfway up to the least that failed
    assert below(runs, caps) == 36
    runs += [open_run(36, 1.0), open_run(39, 0.9)]
    assert below(runs, caps) == 37
    runs.append(open_run(37, 1.0))
    assert below(runs, caps) is None  # 37 held, 39 did not: within 1/16 of 37
    assert true_limit(runs, rule="both", open_loop=True) == 37
    # where the least cap given held, the sweep's own caps hold the limit
    assert below([open_run(56, 1.0), open_run(64, 0.9)], caps) is None


def test_in_open_loop_a_cap_may_refuse_and_still_set_the_limit() -> None:
    def open_run(cap: int, refused: int, continuity: float) -> CapRun:
        return CapRun(cap, "max_streams", 10, 0, refused, continuity, 1.0, None, None, 1.0, 9.0)

    runs = [_run(8, "max_streams"), open_run(2, 12, 1.0), open_run(4, 6, 1.0), open_run(6, 0, 0.9)]
    assert true_limit(runs, open_loop=True) == 4  # what it turned away is not a failure
    assert true_limit(runs) == 8  # the closed loop's own
    closed = CapRun(2, "max_streams", 10, 0, 1, 1.0, 1.0, None, None)
    assert true_limit([closed]) is None  # a closed loop refusing is not continuous


def test_find_limit_sweeps_fixed_caps_then_headroom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fast.yaml"
    config.write_text(FAST)
    argv = ["--config", str(config), "--find-limit", "2,1", "--num-prompts", "4"]
    options = ["--output-len", "8", "--input-len", "4", "--no-progress"]
    assert main(["--log-level", "WARNING", "bench", *argv, *options]) == 0
    out = capsys.readouterr().out
    assert "| max_streams | 1 | 1 | 4/0/0 |" in out
    assert "| max_streams | 2 | 2 | 4/0/0 |" in out
    assert "| headroom | 2 | 2 | 4/0/0 |" in out
    # then staggered arrivals past what the limit carries, under each cap and headroom
    assert "| max_streams | 1 | open loop " in out
    assert "| headroom | 2 | open loop " in out
    assert "(gaps, open loop" in out
    assert "true real-time limit" in out
    assert "headroom (closed loop) admitted at most" in out
    assert "headroom (open loop) admitted at most" in out


def test_in_open_loop_headroom_is_also_set_against_what_the_limits_own_cap_held() -> None:
    def run(cap: int, admission: str, median: float) -> CapRun:
        return CapRun(cap, admission, 10, 0, 3, 1.0, 1.0, median, cap, 1.0, 9.0)

    table = limit_table([run(224, "max_streams", 217.0), run(224, "headroom", 196.0)])
    assert "admitted a median of 196.0 streams (88% of it)" in table
    assert "the cap of 224 itself held a median of 217.0 under the same arrivals" in table
    assert "headroom 90% of it" in table


def test_a_buffering_player_waits_only_where_the_lag_passes_its_buffer() -> None:
    # 80 ms chunks every 100 ms (0.8x): the gaps rule sees 20 ms stalls; a player that
    # buffers 0.25 s first waits only once the lag passes it.
    chunks = [AudioArrival(0.1 * i, 0.08) for i in range(10)]
    assert buffered_stall_s(chunks, 0.25) == 0.0  # 10 chunks: 0.18 s behind at the end
    longer = [AudioArrival(0.1 * i, 0.08) for i in range(20)]
    assert buffered_stall_s(longer, 0.25) == pytest.approx(0.38 - 0.25)
    assert buffered_stall_s([], 0.25) == 0.0
    runs = [
        CapRun(2, "max_streams", 4, 0, 0, 1.0, 1.0, None, None, buffered_rate=1.0),
        CapRun(4, "max_streams", 4, 0, 0, 1.0, 1.0, None, None, buffered_rate=0.5),
    ]
    assert true_limit(runs) == 4
    assert true_limit(runs, rule="buffered") == 2


def test_headroom_is_set_against_the_largest_cap_continuous_by_both_rules() -> None:
    # bench-omni's closed loop: past a whole batch the gaps rule fails where a buffering
    # player still plays through; the 0.6 ms thinker in lockstep: the other way round.
    runs = [
        CapRun(64, "max_streams", 4, 0, 0, 1.0, 1.0, None, None, buffered_rate=1.0),
        CapRun(72, "max_streams", 4, 0, 0, 0.86, 1.0, None, None, buffered_rate=1.0),
        CapRun(80, "max_streams", 4, 0, 0, 0.9, 1.0, None, None, buffered_rate=1.0),
        CapRun(80, "headroom", 4, 0, 0, 1.0, 1.0, 64.0, 64, buffered_rate=1.0),
    ]
    assert (true_limit(runs), true_limit(runs, rule="buffered")) == (64, 80)
    assert true_limit(runs, rule="both") == 64
    lockstep = [
        CapRun(32, "max_streams", 4, 0, 0, 1.0, 1.0, None, None, buffered_rate=1.0),
        CapRun(36, "max_streams", 4, 0, 0, 1.0, 1.0, None, None, buffered_rate=0.5),
    ]
    assert (true_limit(lockstep), true_limit(lockstep, rule="buffered")) == (36, 32)
    assert true_limit(lockstep, rule="both") == 32
    table = limit_table(runs)
    assert "true real-time limit (both, closed loop, largest continuous cap swept): 64" in table
    assert "true real-time limit (buffered, closed loop, largest continuous cap swept): 80" in table
    with pytest.raises(ValueError, match="no continuity rule"):
        runs[0].held("loud")


def test_a_refused_client_waits_as_long_as_the_target_said() -> None:
    settings = LoadSettings(max_concurrency=1, retry_after_s=0.05)
    assert retry_delay_s(Refused("full", 0.7), settings) == 0.7
    assert retry_delay_s(Refused("full"), settings) == 0.05
