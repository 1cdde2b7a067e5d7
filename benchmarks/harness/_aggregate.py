"""Aggregates of one run (one target at one concurrency): pure, from its records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._metrics import (
    RequestMetrics,
    Summary,
    WaveRatios,
    continuity_rate,
    later_waves_over_first,
    later_waves_ratios,
    request_metrics,
    summarize,
    ttfa_by_wave,
    wave_send_spreads_s,
)
from ._record import RequestRecord


@dataclass(frozen=True)
class Throughput:
    duration_s: float  # first measured send to last measured end
    requests_per_s: float
    text_deltas_per_s: float  # output "tokens": one text delta each
    audio_s_per_s: float


@dataclass(frozen=True)
class Aggregates:
    num_completed: int
    num_failed: int
    num_refused: int
    ttft_s: Summary | None
    ttfa_s: Summary | None
    e2el_s: Summary | None
    tpot_s: Summary | None
    itl_s: Summary | None
    chunk_gap_s: Summary | None
    underrun_s: Summary | None
    audio_rtf: Summary | None
    text_to_audio_lag_s: Summary | None
    runtime_added_ttfa_s: Summary | None  # TTFA minus admission wait and the ideal path
    admission_wait_s: Summary | None  # send to the admitted attempt, over the admitted
    refused_after_s: Summary | None  # send to the first refusal, over the refused requests
    continuity_rate: float | None
    ttfa_by_wave: dict[int, Summary]
    later_waves_over_first: float | None
    throughput: Throughput
    later_waves: WaveRatios | None = None
    wave_send_spread_s: Summary | None = None  # each wave's first send to its last


def throughput(records: Sequence[RequestRecord]) -> Throughput:
    """Completed work per second of wall time, over the measured (non-warm-up) requests."""
    measured = [r for r in records if not r.warmup]
    ends = [r.sent_at_s + r.done_at_s for r in measured if r.done_at_s is not None]
    if not measured or not ends:
        return Throughput(0.0, 0.0, 0.0, 0.0)
    duration_s = max(ends) - min(r.sent_at_s for r in measured)
    done = [r for r in measured if r.outcome == "completed"]
    if duration_s <= 0:
        return Throughput(duration_s, 0.0, 0.0, 0.0)
    return Throughput(
        duration_s=duration_s,
        requests_per_s=len(done) / duration_s,
        text_deltas_per_s=sum(r.num_text_deltas for r in done) / duration_s,
        audio_s_per_s=sum(r.audio_s for r in done) / duration_s,
    )


def aggregate(
    records: Sequence[RequestRecord], ideal_ttfa_s: float | None = None
) -> tuple[Aggregates, list[RequestMetrics]]:
    """The aggregates over the measured requests, and each measured request's metrics."""
    measured = [r for r in records if not r.warmup]
    metrics = [request_metrics(r) for r in measured]
    ok = [m for m, r in zip(metrics, measured, strict=True) if r.outcome == "completed"]
    by_wave = ttfa_by_wave(ok)
    return (
        Aggregates(
            num_completed=len(ok),
            num_failed=sum(r.outcome == "failed" for r in measured),
            num_refused=sum(r.outcome == "refused" for r in measured),
            ttft_s=summarize(m.ttft_s for m in ok),
            ttfa_s=summarize(m.ttfa_s for m in ok),
            e2el_s=summarize(m.e2el_s for m in ok),
            tpot_s=summarize(m.tpot_s for m in ok),
            itl_s=summarize(gap for m in ok for gap in m.itl_s),
            chunk_gap_s=summarize(gap for m in ok for gap in m.chunk_gaps_s),
            underrun_s=summarize(m.underrun_s for m in ok),
            audio_rtf=summarize(m.audio_rtf for m in ok),
            text_to_audio_lag_s=summarize(m.text_to_audio_lag_s for m in ok),
            runtime_added_ttfa_s=(
                None
                if ideal_ttfa_s is None
                else summarize(
                    m.ttfa_s - m.admission_wait_s - ideal_ttfa_s for m in ok if m.ttfa_s is not None
                )
            ),
            admission_wait_s=summarize(m.admission_wait_s for m in ok),
            refused_after_s=summarize(r.refused_after_s for r in measured),
            continuity_rate=continuity_rate(ok),
            ttfa_by_wave=by_wave,
            later_waves_over_first=later_waves_over_first(by_wave),
            throughput=throughput(measured),
            later_waves=later_waves_ratios(ok),
            wave_send_spread_s=summarize(wave_send_spreads_s(measured)),
        ),
        metrics,
    )
