"""Streaming metrics: pure functions over request timelines.

The definitions follow vllm-omni's ``bench serve --omni`` so numbers compare:

- **TTFT**: send to the first text delta. **TTFA** (audio TTFP): send to the
  first audio chunk. **E2EL**: send to the end of the response.
- **ITL**: gaps between consecutive text deltas; **TPOT**: time per text delta
  after the first, ``(last - first) / (n - 1)``.
- **Audio RTF**: E2EL over the seconds of audio produced (< 1 is faster than
  real time).
- **Inter-chunk gap**: gaps between consecutive audio chunks.
- **Underrun**: a player starts at the first chunk's arrival and plays chunks
  back to back; when the next chunk has not arrived by the time the audio
  before it has played out, the player is starved until it does. The metric is
  the worst single starvation, in seconds (0 when the audio never stalls).
- **Continuity**: a request is continuous when its underrun is at most
  ``CONTINUITY_THRESHOLD_S`` (100 ms, vllm-omni's default).
- **Text-to-audio lag**: TTFA minus TTFT (vllm-omni has no such metric; it is
  the gap a user hears between reading the reply and hearing it).
- **Admission wait**: send to the start of the attempt that was admitted (a
  refused request's retries); the *runtime-added TTFA* is TTFA minus this wait
  minus the ideal critical path, so a refusal policy and a queue are told apart.
- **Later waves / first**: median of the later waves' medians over wave 0's
  median, and the mean and p90 of every later-wave request's TTFA over wave 0's
  (seed 001's rise lives in the tail and the mean).
- **Waves**: by send time: the ``k``-th request sent (``sent_at_s`` order) belongs
  to wave ``k // max_concurrency`` (``waves_by_send_time``). Not by request
  index: trio starts the clients' tasks in no set order.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._record import AudioArrival, RequestRecord

CONTINUITY_THRESHOLD_S = 0.1


@dataclass(frozen=True)
class Summary:
    """Distribution of one metric over requests (or samples)."""

    count: int
    mean: float
    median: float
    p90: float
    p99: float
    min: float
    max: float


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks.

    Matches ``numpy.percentile``'s default; ``values`` need not be sorted.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Iterable[float | None]) -> Summary | None:
    """Mean, median, p90, p99, min and max of the values that are not None."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Summary(
        count=len(present),
        mean=sum(present) / len(present),
        median=percentile(present, 50),
        p90=percentile(present, 90),
        p99=percentile(present, 99),
        min=min(present),
        max=max(present),
    )


def gaps(times_s: Sequence[float]) -> list[float]:
    """Differences between consecutive arrival times."""
    return [later - earlier for earlier, later in itertools.pairwise(times_s)]


def worst_underrun_s(chunks: Sequence[AudioArrival]) -> float:
    """The longest time a player starting at the first chunk waits for the next one."""
    if not chunks:
        return 0.0
    play_end_s = chunks[0].at_s + chunks[0].duration_s
    worst_s = 0.0
    for chunk in chunks[1:]:
        stall_s = chunk.at_s - play_end_s
        worst_s = max(worst_s, stall_s)
        play_end_s = max(play_end_s, chunk.at_s) + chunk.duration_s
    return worst_s


@dataclass(frozen=True)
class RequestMetrics:
    """Per-request metrics, None where the request produced nothing to measure."""

    index: int
    wave: int
    ttft_s: float | None
    ttfa_s: float | None
    e2el_s: float | None
    tpot_s: float | None
    itl_s: tuple[float, ...]
    chunk_gaps_s: tuple[float, ...]
    audio_s: float
    audio_rtf: float | None
    underrun_s: float | None
    continuous: bool | None
    text_to_audio_lag_s: float | None
    admission_wait_s: float = 0.0


def request_metrics(record: RequestRecord) -> RequestMetrics:
    text = record.text_at_s
    chunks = record.audio
    ttft = text[0] if text else None
    ttfa = chunks[0].at_s if chunks else None
    audio_s = record.audio_s
    underrun = worst_underrun_s(chunks) if chunks else None
    return RequestMetrics(
        index=record.index,
        wave=record.wave,
        ttft_s=ttft,
        ttfa_s=ttfa,
        e2el_s=record.done_at_s if record.outcome == "completed" else None,
        tpot_s=(text[-1] - text[0]) / (len(text) - 1) if len(text) > 1 else None,
        itl_s=tuple(gaps(text)),
        chunk_gaps_s=tuple(gaps([c.at_s for c in chunks])),
        audio_s=audio_s,
        audio_rtf=(
            record.done_at_s / audio_s
            if record.done_at_s is not None and audio_s > 0 and record.outcome == "completed"
            else None
        ),
        underrun_s=underrun,
        continuous=None if underrun is None else underrun <= CONTINUITY_THRESHOLD_S,
        text_to_audio_lag_s=ttfa - ttft if ttfa is not None and ttft is not None else None,
        admission_wait_s=record.admitted_at_s,
    )


def wave_of(index: int, max_concurrency: int) -> int:
    """The wave of the ``index``-th request when at most ``max_concurrency`` run at once."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    return index // max_concurrency


def waves_by_send_time(
    records: Sequence[RequestRecord], max_concurrency: int
) -> list[RequestRecord]:
    """``records`` with each one's wave set from the order it was sent in (ties by index);
    warm-up and measured requests are ranked apart."""
    waves: dict[int, int] = {}
    for warmup in (True, False):
        ranked = sorted(
            (r for r in records if r.warmup == warmup), key=lambda r: (r.sent_at_s, r.index)
        )
        waves |= {id(r): wave_of(rank, max_concurrency) for rank, r in enumerate(ranked)}
    return [dataclasses.replace(r, wave=waves[id(r)]) for r in records]


def wave_send_spreads_s(records: Iterable[RequestRecord]) -> list[float]:
    """Each wave's send spread: its first request sent to its last, waves of two or more
    measured requests. In a closed loop a wave's clients send one after another on one
    thread, each admitted in its turn, and the ideal TTFA counts them as sent together:
    the spread is how much of a wave's added TTFA that serial turnover is."""
    sent: dict[int, list[float]] = {}
    for r in records:
        if not r.warmup:
            sent.setdefault(r.wave, []).append(r.sent_at_s)
    return [max(times) - min(times) for _, times in sorted(sent.items()) if len(times) > 1]


def ttfa_by_wave(metrics: Iterable[RequestMetrics]) -> dict[int, Summary]:
    """TTFA summarized per wave, waves in order; waves without audio are left out."""
    per_wave: dict[int, list[float]] = {}
    for m in metrics:
        if m.ttfa_s is not None:
            per_wave.setdefault(m.wave, []).append(m.ttfa_s)
    return {
        wave: summary
        for wave, values in sorted(per_wave.items())
        if (summary := summarize(values)) is not None
    }


def later_waves_over_first(by_wave: dict[int, Summary]) -> float | None:
    """Median TTFA of all later waves' medians over wave 0's median (seed 001's spike)."""
    if 0 not in by_wave or len(by_wave) < 2 or by_wave[0].median <= 0:
        return None
    later = [s.median for wave, s in by_wave.items() if wave > 0]
    return percentile(later, 50) / by_wave[0].median


@dataclass(frozen=True)
class WaveRatios:
    """Later waves' TTFA over the first wave's, three ways (see the module docstring)."""

    median: float
    mean: float
    p90: float


def later_waves_ratios(metrics: Iterable[RequestMetrics]) -> WaveRatios | None:
    """Later waves over wave 0 by median of medians, by mean and by p90 (None without
    a wave 0 and a later wave with audio)."""
    listed = list(metrics)
    median = later_waves_over_first(ttfa_by_wave(listed))
    first = [m.ttfa_s for m in listed if m.wave == 0 and m.ttfa_s is not None]
    later = [m.ttfa_s for m in listed if m.wave > 0 and m.ttfa_s is not None]
    if median is None or not first or not later:
        return None
    first_mean = sum(first) / len(first)
    return WaveRatios(
        median=median,
        mean=(sum(later) / len(later)) / first_mean,
        p90=percentile(later, 90) / percentile(first, 90),
    )


def continuity_rate(metrics: Iterable[RequestMetrics]) -> float | None:
    """Share of requests with audio whose worst underrun is within the threshold."""
    flags = [m.continuous for m in metrics if m.continuous is not None]
    return sum(flags) / len(flags) if flags else None
