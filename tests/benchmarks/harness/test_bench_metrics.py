"""The benchmark's metrics are pure functions: checked here on hand-made timelines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import omnitrio
from benchmarks.harness import (
    AudioArrival,
    RequestRecord,
    aggregate,
    arrival_offsets_s,
    percentile,
    request_metrics,
    summarize,
    ttfa_by_wave,
    wave_of,
    waves_by_send_time,
    worst_underrun_s,
)
from benchmarks.harness._metrics import later_waves_over_first
from benchmarks.harness._profile import (
    capacity_requests_per_s,
    ideal_first_audio_s,
    max_continuous_streams,
    open_loop_capacity_requests_per_s,
    synthetic_profiles,
)
from benchmarks.harness._report import RunReport, report_run, spread_table
from benchmarks.harness._runner import RunResult

REPO = Path(__file__).resolve().parents[3]


def chunks(*pairs: tuple[float, float]) -> tuple[AudioArrival, ...]:
    return tuple(AudioArrival(at, duration) for at, duration in pairs)


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_summarize_skips_missing_values() -> None:
    summary = summarize([None, 1.0, 3.0, None])
    assert summary is not None
    assert (summary.count, summary.mean, summary.median, summary.min, summary.max) == (
        2,
        2.0,
        2.0,
        1.0,
        3.0,
    )
    assert summarize([None]) is None


def test_a_player_fed_ahead_of_time_never_starves() -> None:
    # 100 ms chunks arriving every 50 ms: the buffer only grows.
    assert worst_underrun_s(chunks((0.2, 0.1), (0.25, 0.1), (0.3, 0.1))) == 0.0
    assert worst_underrun_s(()) == 0.0
    assert worst_underrun_s(chunks((0.2, 0.1))) == 0.0


def test_underrun_is_the_worst_single_stall_after_the_first_chunk() -> None:
    # Plays 0.2-0.3, next arrives 0.35 (stall 0.05), plays to 0.45; next at 0.6 (stall 0.15).
    timeline = chunks((0.2, 0.1), (0.35, 0.1), (0.6, 0.1))
    assert worst_underrun_s(timeline) == pytest.approx(0.15)


def test_a_buffer_built_early_absorbs_a_late_chunk() -> None:
    # Three chunks at once buffer 0.3 s (to 0.3); the fourth at 0.32 stalls only 0.02.
    timeline = chunks((0.0, 0.1), (0.0, 0.1), (0.0, 0.1), (0.32, 0.1))
    assert worst_underrun_s(timeline) == pytest.approx(0.02)


def test_request_metrics_from_a_hand_made_timeline() -> None:
    record = RequestRecord(
        index=5,
        wave=1,
        sent_at_s=2.0,
        outcome="completed",
        text_at_s=(0.05, 0.07, 0.10, 0.13),
        audio=chunks((0.2, 0.08), (0.25, 0.08), (0.45, 0.08)),
        done_at_s=0.5,
    )
    m = request_metrics(record)
    assert (m.ttft_s, m.ttfa_s, m.e2el_s) == (0.05, 0.2, 0.5)
    assert m.tpot_s == pytest.approx(0.08 / 3)
    assert m.itl_s == pytest.approx((0.02, 0.03, 0.03))
    assert m.chunk_gaps_s == pytest.approx((0.05, 0.2))
    assert m.audio_s == pytest.approx(0.24)
    assert m.audio_rtf == pytest.approx(0.5 / 0.24)
    assert m.underrun_s == pytest.approx(0.09)  # played to 0.36, the third came at 0.45
    assert m.continuous is True
    assert m.text_to_audio_lag_s == pytest.approx(0.15)


def test_a_long_stall_breaks_continuity_and_text_only_requests_have_no_audio_metrics() -> None:
    stalled = RequestRecord(
        0, 0, 0.0, "completed", audio=chunks((0.1, 0.05), (0.4, 0.05)), done_at_s=0.5
    )
    assert request_metrics(stalled).continuous is False
    text_only = RequestRecord(0, 0, 0.0, "completed", text_at_s=(0.1,), done_at_s=0.2)
    m = request_metrics(text_only)
    assert (m.ttfa_s, m.underrun_s, m.continuous, m.audio_rtf, m.tpot_s) == (
        None,
        None,
        None,
        None,
        None,
    )


def test_waves_and_ttfa_per_wave() -> None:
    assert [wave_of(i, 4) for i in range(9)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    with pytest.raises(ValueError, match="at least 1"):
        wave_of(0, 0)
    records = [
        RequestRecord(i, wave_of(i, 2), 0.0, "completed", audio=chunks((ttfa, 0.1)), done_at_s=1)
        for i, ttfa in enumerate([0.1, 0.1, 0.3, 0.3, 0.2, 0.2])
    ]
    by_wave = ttfa_by_wave(request_metrics(r) for r in records)
    assert {w: s.median for w, s in by_wave.items()} == pytest.approx({0: 0.1, 1: 0.3, 2: 0.2})
    assert later_waves_over_first(by_wave) == pytest.approx(2.5)  # median(0.3, 0.2) / 0.1


def test_waves_follow_the_send_order_not_the_request_index() -> None:
    # trio started the clients in another order than their indices: index 3 went first.
    sent = {3: 0.0, 0: 0.01, 2: 0.01, 1: 0.5, 5: 0.6, 4: 0.7}
    records = [RequestRecord(i, 0, sent[i], "completed") for i in range(6)]
    warm = RequestRecord(0, 0, 9.0, "completed", warmup=True)
    waves = {r.index: r.wave for r in waves_by_send_time([*records, warm], 2) if not r.warmup}
    # Ranks: 3, 0, 2 (tie on send time: by index), 1, 5, 4.
    assert waves == {3: 0, 0: 0, 2: 1, 1: 1, 5: 2, 4: 2}
    assert [r.wave for r in waves_by_send_time([warm], 2)] == [0]  # ranked apart


def test_a_waves_send_spread_is_its_first_send_to_its_last() -> None:
    sent = [0.0, 0.004, 0.001, 0.5, 0.509, 0.9]  # six requests, waves of two by send order
    records = waves_by_send_time(
        [RequestRecord(i, 0, at, "completed", done_at_s=1) for i, at in enumerate(sent)], 2
    )
    warm = RequestRecord(9, 0, 0.0, "completed", done_at_s=1, warmup=True)
    result, _ = aggregate([*records, warm])
    # waves (0.0, 0.001), (0.004, 0.5), (0.509, 0.9): the warm-up left out
    assert result.wave_send_spread_s is not None
    assert result.wave_send_spread_s.count == 3
    assert result.wave_send_spread_s.max == pytest.approx(0.496)
    assert result.wave_send_spread_s.min == pytest.approx(0.001)


def test_time_to_refusal_is_summarized_over_the_refused() -> None:
    refused = [
        RequestRecord(i, 0, 0.0, "refused", num_refusals=1, refused_after_s=0.001 * (i + 1))
        for i in range(3)
    ]
    admitted_later = RequestRecord(3, 0, 0.0, "completed", refused_after_s=0.004, done_at_s=1)
    result, _ = aggregate([*refused, RequestRecord(4, 0, 0.0, "completed"), admitted_later])
    assert result.refused_after_s is not None
    assert (result.refused_after_s.count, result.refused_after_s.max) == (4, 0.004)
    assert result.num_refused == 3


def test_aggregate_counts_outcomes_throughput_and_leaves_warmup_out() -> None:
    done = [
        RequestRecord(
            i,
            0,
            sent_at_s=float(i),
            outcome="completed",
            text_at_s=(0.1, 0.2),
            audio=chunks((0.3, 0.5)),
            done_at_s=1.0,
        )
        for i in range(3)
    ]
    warm = RequestRecord(0, 0, -5.0, "completed", done_at_s=100.0, warmup=True)
    failed = RequestRecord(3, 0, 0.5, "failed", error="boom")
    refused = RequestRecord(4, 0, 0.5, "refused", num_refusals=3)
    result, metrics = aggregate([warm, *done, failed, refused], ideal_ttfa_s=0.25)
    assert (result.num_completed, result.num_failed, result.num_refused) == (3, 1, 1)
    assert len(metrics) == 5
    assert result.throughput.duration_s == pytest.approx(3.0)  # first send 0 -> last end 3
    assert result.throughput.requests_per_s == pytest.approx(1.0)
    assert result.throughput.text_deltas_per_s == pytest.approx(2.0)
    assert result.throughput.audio_s_per_s == pytest.approx(0.5)
    assert result.runtime_added_ttfa_s is not None
    assert result.runtime_added_ttfa_s.median == pytest.approx(0.05)
    assert result.continuity_rate == 1.0


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate() -> None:
    assert arrival_offsets_s(3, math.inf) == [0.0, 0.0, 0.0]
    offsets = arrival_offsets_s(2000, request_rate=50.0, burstiness=1.0, seed=7)
    assert offsets == arrival_offsets_s(2000, 50.0, 1.0, seed=7)
    assert offsets == sorted(offsets)
    assert offsets[0] == 0.0
    assert 2000 / offsets[-1] == pytest.approx(50.0, rel=0.1)
    bursty = arrival_offsets_s(2000, 50.0, burstiness=0.2, seed=7)
    assert 2000 / bursty[-1] == pytest.approx(50.0, rel=0.25)
    with pytest.raises(ValueError, match="burstiness"):
        arrival_offsets_s(1, 1.0, burstiness=0)


def test_ideal_first_audio_and_capacity_of_the_default_synthetic_pipeline() -> None:
    config = omnitrio.load_config(REPO / "configs" / "synthetic.yaml")
    profiles = synthetic_profiles(config)
    assert profiles is not None
    # The talker (6 ms/frame) lags the thinker (4 ms/token): frame 4 leaves it at
    # 4 + 4 * 6 = 28 ms, then one 3 ms code2wav step makes the first audio.
    assert ideal_first_audio_s(profiles, steps=24) == pytest.approx(0.031)
    # The talker is the bottleneck: 32 streams per 6 ms step, 24 steps per request.
    assert capacity_requests_per_s(profiles, steps=24) == pytest.approx(32 / (24 * 0.006))
    # With 8 streams the batches hold 8: a zero-overhead runtime serves a quarter of that.
    assert capacity_requests_per_s(profiles, 24, streams=8) == pytest.approx(8 / (24 * 0.006))
    assert capacity_requests_per_s(profiles, 24, streams=64) == pytest.approx(32 / (24 * 0.006))
    # 80 ms of audio per 4 frames: 20 ms per frame; a talker round stays within it
    # while the streams fit 3 batches (3 x 6 ms = 18 ms).
    assert max_continuous_streams(profiles) == 96
    non_synthetic = config.model_copy(
        update={"stages": (config.stages[0].model_copy(update={"impl": "x:Y"}),)}
    )
    assert synthetic_profiles(non_synthetic) is None


def test_capacity_counts_the_source_stages_prefill() -> None:
    profiles = synthetic_profiles(omnitrio.load_config(REPO / "configs" / "bench-omni.yaml"))
    assert profiles is not None
    # The thinker is the bottleneck: 64 requests of 32 tokens take 32 steps of
    # 8 + 64 x 0.15 ms, one 20 ms prefill and 0.05 ms per word of 64 32-word prompts.
    busy_s = 32 * (0.008 + 64 * 0.15e-3) + 0.020 + 0.05e-3 * 32 * 64
    assert capacity_requests_per_s(profiles, 32, num_words=32) == pytest.approx(64 / busy_s)
    assert 93 < 64 / busy_s < 94  # 113.6 with the prefill left out
    assert capacity_requests_per_s(profiles, 32) == pytest.approx(64 / (busy_s - 0.05e-3 * 32 * 64))


def test_open_loop_capacity_charges_one_prefill_per_arrival() -> None:
    profiles = synthetic_profiles(omnitrio.load_config(REPO / "configs" / "bench-omni.yaml"))
    assert profiles is not None
    # Arrivals one at a time each land on a step of their own, which the thinker
    # charges a whole 20 ms prefill: 64 of them per batch, not one.
    steps_s = 32 * (0.008 + 64 * 0.15e-3)
    open_loop_s = steps_s + 64 * 0.020 + 0.05e-3 * 32 * 64
    assert open_loop_capacity_requests_per_s(profiles, 32, num_words=32) == pytest.approx(
        64 / open_loop_s
    )
    closed_loop = capacity_requests_per_s(profiles, 32, num_words=32)
    assert open_loop_capacity_requests_per_s(profiles, 32, num_words=32) < 0.5 * closed_loop
    # Stages without prefill are charged the same either way.
    synthetic = synthetic_profiles(omnitrio.load_config(REPO / "configs" / "synthetic.yaml"))
    assert synthetic is not None
    assert open_loop_capacity_requests_per_s(synthetic, 24) == capacity_requests_per_s(
        synthetic, 24
    )


def test_the_qwen3_omni_workload_profile() -> None:
    profiles = synthetic_profiles(omnitrio.load_config(REPO / "configs" / "bench-qwen3-omni.yaml"))
    assert profiles is not None
    thinker_s, talker_s, code2wav_s = 0.006 + 0.35e-3 + 1e-3, 0.005 + 0.15e-3 + 1e-3, 0.0113
    # One stream: the prefill and first token, then the talker (3.5 frames per token,
    # slower than the tokens come) makes 25 frames, then one code2wav window.
    first_token_s = 0.010 + 0.01e-3 * 32 + thinker_s
    assert ideal_first_audio_s(profiles, 256, 32) == pytest.approx(
        first_token_s + 25 * talker_s + code2wav_s
    )
    # The talker is the bottleneck: 896 frames per 256-token answer, one step each.
    full_talker_step_s = 0.005 + 32 * 0.15e-3 + 1e-3
    assert capacity_requests_per_s(profiles, 256) == pytest.approx(32 / (896 * full_talker_step_s))
    # A frame every 80 ms per stream: talker rounds of 10.8 ms, 7 of them (224 streams).
    assert max_continuous_streams(profiles) == 224
    # Layout 1:2: two talker GPUs halve its share of the batch; the thinker is next.
    split = synthetic_profiles(omnitrio.load_config(REPO / "configs" / "bench-qwen3-omni-1x2.yaml"))
    assert split is not None
    two_gpus_s = 0.005 + 32 * 0.15e-3 + 2 * 1e-3
    assert capacity_requests_per_s(split, 256) == pytest.approx(64 / (896 * two_gpus_s))


def test_later_waves_by_mean_and_p90_see_a_tail_the_median_misses() -> None:
    # Wave 1's median stays at wave 0's, but a quarter of it waits 4x as long.
    ttfas = [0.1] * 4 + [0.1, 0.1, 0.1, 0.4]
    records = [
        RequestRecord(i, wave_of(i, 4), 0.0, "completed", audio=chunks((t, 0.1)), done_at_s=1)
        for i, t in enumerate(ttfas)
    ]
    result, _ = aggregate(records)
    assert result.later_waves is not None
    assert result.later_waves.median == pytest.approx(1.0)
    assert result.later_waves.mean == pytest.approx(0.175 / 0.1)
    assert result.later_waves.p90 == pytest.approx(percentile([0.1, 0.1, 0.1, 0.4], 90) / 0.1)


def test_admission_wait_is_reported_apart_from_runtime_added_ttfa() -> None:
    # Refused twice, admitted 0.1 s after it was sent; the stages then took the ideal path.
    retried = RequestRecord(
        0, 0, 0.0, "completed", audio=chunks((0.35, 0.1)), done_at_s=1, admitted_at_s=0.1
    )
    at_once = RequestRecord(1, 0, 0.0, "completed", audio=chunks((0.25, 0.1)), done_at_s=1)
    result, _ = aggregate([retried, at_once], ideal_ttfa_s=0.25)
    assert result.admission_wait_s is not None
    assert result.admission_wait_s.max == pytest.approx(0.1)
    assert result.runtime_added_ttfa_s is not None
    assert result.runtime_added_ttfa_s.max == pytest.approx(0.0)


def test_the_spread_table_gives_each_ratio_over_the_repetitions() -> None:
    def run(target: str, rep: int, ttfa_s: float) -> RunReport:
        records = [
            RequestRecord(i, 0, 0.0, "completed", audio=chunks((ttfa_s, 0.1)), done_at_s=1)
            for i in range(2)
        ]
        result = RunResult(target, 2, math.inf, rep, tuple(records), (), False)
        return report_run(result, ideal_ttfa_s=0.1)

    reports = [
        run(name, rep, ttfa)
        for rep, (ours, theirs) in enumerate([(0.2, 0.4), (0.3, 0.4), (0.2, 0.8)])
        for name, ttfa in (("omnitrio", ours), ("model", theirs))
    ]
    (row,) = spread_table(reports, "omnitrio").splitlines()[2:]
    # TTFA p99 ratios 0.5, 0.75, 0.25; the bound: ideal 0.1 over 0.4, 0.4, 0.8.
    assert row.startswith("| model | c=2 | 0.50 [0.25-0.75] (3) | 0.50 [0.25-0.75] (3) |")
    assert row.endswith("| 0.25 [0.12-0.25] (3) |")
