"""Reports: a JSON document with every record and aggregate, and Markdown tables."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._aggregate import Aggregates, aggregate
from ._metrics import Summary
from ._runner import RunResult
from ._target import Sample


@dataclass(frozen=True)
class SampleSummary:
    max_queue_depth: dict[str, int]
    mean_batch_size: dict[str, float]
    max_stall_ms: dict[str, float]
    rss_start_bytes: int | None
    rss_max_bytes: int | None
    rss_end_bytes: int | None


def summarize_samples(samples: Sequence[Sample]) -> SampleSummary:
    depth: dict[str, int] = {}
    batches: dict[str, list[float]] = {}
    stalls: dict[str, float] = {}
    for s in samples:
        for stage, value in s.queue_depth.items():
            depth[stage] = max(depth.get(stage, 0), value)
        for stage, size in s.batch_size.items():
            batches.setdefault(stage, []).append(size)
        for stage, stall in s.stall_ms.items():
            stalls[stage] = max(stalls.get(stage, 0.0), stall)
    rss = [s.rss_bytes for s in samples if s.rss_bytes is not None]
    return SampleSummary(
        max_queue_depth=depth,
        mean_batch_size={k: sum(v) / len(v) for k, v in batches.items()},
        max_stall_ms=stalls,
        rss_start_bytes=rss[0] if rss else None,
        rss_max_bytes=max(rss) if rss else None,
        rss_end_bytes=rss[-1] if rss else None,
    )


@dataclass(frozen=True)
class RunReport:
    run: RunResult
    aggregates: Aggregates
    samples: SampleSummary
    ideal_ttfa_s: float | None = None  # the zero-overhead TTFA of its load, if known


def report_run(run: RunResult, ideal_ttfa_s: float | None) -> RunReport:
    aggregates, _ = aggregate(run.records, ideal_ttfa_s)
    return RunReport(run, aggregates, summarize_samples(run.samples), ideal_ttfa_s)


def to_json(reports: Sequence[RunReport], context: dict[str, Any]) -> str:
    runs = []
    for report in reports:
        _, metrics = aggregate(report.run.records)
        runs.append(
            {
                "target": report.run.target,
                "max_concurrency": report.run.max_concurrency,
                "request_rate": report.run.request_rate
                if not math.isinf(report.run.request_rate)
                else None,
                "repetition": report.run.repetition,
                "timed_out": report.run.timed_out,
                "load_average": list(report.run.load_average),
                "aggregates": dataclasses.asdict(report.aggregates),
                "target_samples": dataclasses.asdict(report.samples),
                "requests": [dataclasses.asdict(r) for r in report.run.records],
                "request_metrics": [dataclasses.asdict(m) for m in metrics],
                "samples": [dataclasses.asdict(s) for s in report.run.samples],
            }
        )
    return json.dumps({**context, "runs": runs}, indent=1)


def _ms(summary: Summary | None, field: str = "median") -> str:
    return "-" if summary is None else f"{getattr(summary, field) * 1000:.1f}"


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def load_label(run: RunResult) -> str:
    """``c=N`` for a closed loop, the offered rate for an open one."""
    if math.isinf(run.request_rate):
        return f"c={run.max_concurrency}"
    return f"{run.request_rate:.1f}/s"


_COLUMNS: list[tuple[str, Callable[[RunReport], str]]] = [
    ("target", lambda r: r.run.target),
    ("load", lambda r: load_label(r.run)),
    ("rep", lambda r: str(r.run.repetition)),
    ("ok/fail/refused", lambda r: _outcomes(r.aggregates)),
    ("refused in p99", lambda r: _ms(r.aggregates.refused_after_s, "p99")),
    ("TTFT p50", lambda r: _ms(r.aggregates.ttft_s)),
    ("TTFA p50", lambda r: _ms(r.aggregates.ttfa_s)),
    ("TTFA p99", lambda r: _ms(r.aggregates.ttfa_s, "p99")),
    ("admission wait p99", lambda r: _ms(r.aggregates.admission_wait_s, "p99")),
    ("added TTFA p50/p99", lambda r: _added(r.aggregates)),
    ("E2EL p50", lambda r: _ms(r.aggregates.e2el_s)),
    ("ITL p50/p99", lambda r: f"{_ms(r.aggregates.itl_s)}/{_ms(r.aggregates.itl_s, 'p99')}"),
    ("chunk gap p99", lambda r: _ms(r.aggregates.chunk_gap_s, "p99")),
    ("underrun p99", lambda r: _ms(r.aggregates.underrun_s, "p99")),
    ("continuity", lambda r: _num(r.aggregates.continuity_rate, "{:.0%}")),
    ("RTF p50", lambda r: _num(r.aggregates.audio_rtf.median if r.aggregates.audio_rtf else None)),
    ("req/s", lambda r: f"{r.aggregates.throughput.requests_per_s:.1f}"),
    ("goodput/s", lambda r: _goodput(r.aggregates)),
    ("tok/s", lambda r: f"{r.aggregates.throughput.text_deltas_per_s:.0f}"),
    ("audio s/s", lambda r: f"{r.aggregates.throughput.audio_s_per_s:.2f}"),
    ("later/first wave p50/mean/p90", lambda r: _waves(r.aggregates)),
    ("max queue", lambda r: str(sum(r.samples.max_queue_depth.values()))),
    ("max stall ms", lambda r: _num(max(r.samples.max_stall_ms.values(), default=None), "{:.0f}")),
    ("peak RSS MB", lambda r: _num(_mb(r.samples.rss_max_bytes), "{:.0f}")),
    ("load avg", lambda r: "{:.1f}-{:.1f}".format(*r.run.load_average)),
]


def _waves(a: Aggregates) -> str:
    w = a.later_waves
    return "-" if w is None else f"{w.median:.2f}/{w.mean:.2f}/{w.p90:.2f}"


def _goodput(a: Aggregates) -> str:
    """Continuous completed requests per second."""
    if a.continuity_rate is None:
        return "-"
    return f"{a.continuity_rate * a.throughput.requests_per_s:.2f}"


def _outcomes(a: Aggregates) -> str:
    return f"{a.num_completed}/{a.num_failed}/{a.num_refused}"


def _added(a: Aggregates) -> str:
    return f"{_ms(a.runtime_added_ttfa_s)}/{_ms(a.runtime_added_ttfa_s, 'p99')}"


def _mb(value: int | None) -> float | None:
    return None if value is None else value / 1e6


def markdown_table(reports: Sequence[RunReport]) -> str:
    """One row per run; times in ms."""
    header = "| " + " | ".join(name for name, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    rows = ["| " + " | ".join(cell(r) for _, cell in _COLUMNS) + " |" for r in reports]
    return "\n".join([header, rule, *rows])


_RATIOS: list[tuple[str, Callable[[Aggregates], float | None]]] = [
    ("TTFA p50", lambda a: a.ttfa_s.median if a.ttfa_s else None),
    ("TTFA p99", lambda a: a.ttfa_s.p99 if a.ttfa_s else None),
    ("E2EL p50", lambda a: a.e2el_s.median if a.e2el_s else None),
    ("underrun p99", lambda a: a.underrun_s.p99 if a.underrun_s else None),
    ("req/s", lambda a: a.throughput.requests_per_s),
    ("audio s/s", lambda a: a.throughput.audio_s_per_s),
]


def ratio_table(reports: Sequence[RunReport], subject: str) -> str:
    """``subject`` / baseline for each metric, per concurrency and baseline.

    Below 1 is better for times; above 1 is better for throughput."""
    by_key = {_key(r): r for r in reports}
    header = "| baseline | load | rep | " + " | ".join(name for name, _ in _RATIOS) + " |"
    rule = "|---|---|---|" + "|".join("---" for _ in _RATIOS) + "|"
    rows = []
    for (target, conc, rate, rep), base in by_key.items():
        ours = by_key.get((subject, conc, rate, rep))
        if target == subject or ours is None:
            continue
        cells = [_ratio(get(ours.aggregates), get(base.aggregates)) for _, get in _RATIOS]
        rows.append(
            f"| {target} | {load_label(base.run)} | {base.run.repetition} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join([header, rule, *rows]) if rows else ""


def spread_table(reports: Sequence[RunReport], subject: str) -> str:
    """``subject`` / baseline over the repetitions of each load: median [min-max] (n),
    with the zero-overhead bound beside TTFA p99 (the ideal TTFA over the baseline's
    median TTFA p99: the best ratio a runtime adding nothing could show)."""
    by_key = {_key(r): r for r in reports}
    ratios: dict[tuple[str, int, float], list[list[float | None]]] = {}
    bounds: dict[tuple[str, int, float], list[float]] = {}
    for (target, conc, rate, rep), base in by_key.items():
        ours = by_key.get((subject, conc, rate, rep))
        if target == subject or ours is None:
            continue
        row = [_divide(get(ours.aggregates), get(base.aggregates)) for _, get in _RATIOS]
        ratios.setdefault((target, conc, rate), []).append(row)
        base_p99 = base.aggregates.ttfa_s.p99 if base.aggregates.ttfa_s else None
        if base.ideal_ttfa_s is not None and base_p99:
            bounds.setdefault((target, conc, rate), []).append(base.ideal_ttfa_s / base_p99)
    names = [name for name, _ in _RATIOS]
    header = "| baseline | load | " + " | ".join(names) + " | zero-overhead TTFA p99 bound |"
    rule = "|---|---|" + "|".join("---" for _ in names) + "|---|"
    rows = []
    for (target, conc, rate), runs in ratios.items():
        cells = [_spread([run[i] for run in runs]) for i in range(len(names))]
        load = by_key[(target, conc, rate, 0)].run if (target, conc, rate, 0) in by_key else None
        label = load_label(load) if load is not None else f"c={conc}"
        bound = _spread(list(bounds.get((target, conc, rate), [])))
        rows.append(f"| {target} | {label} | " + " | ".join(cells) + f" | {bound} |")
    return "\n".join([header, rule, *rows]) if rows else ""


def _divide(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or theirs is None or theirs == 0 else ours / theirs


def _spread(values: Sequence[float | None]) -> str:
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    middle = (
        present[len(present) // 2]
        if len(present) % 2
        else (present[len(present) // 2 - 1] + present[len(present) // 2]) / 2
    )
    return f"{middle:.2f} [{present[0]:.2f}-{present[-1]:.2f}] ({len(present)})"


def _key(report: RunReport) -> tuple[str, int, float, int]:
    run = report.run
    return (run.target, run.max_concurrency, run.request_rate, run.repetition)


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or theirs == 0:
        return "-"
    return f"{ours / theirs:.2f}"


def wave_table(reports: Sequence[RunReport]) -> str:
    """Median TTFA per wave (ms), one row per run."""
    rows = []
    num_waves = max((len(r.aggregates.ttfa_by_wave) for r in reports), default=0)
    for r in reports:
        waves = r.aggregates.ttfa_by_wave
        cells = [_ms(waves.get(w)) for w in range(num_waves)]
        label = f"| {r.run.target} | {load_label(r.run)} | {r.run.repetition} | "
        rows.append(label + " | ".join(cells) + " |")
    header = "| target | load | rep | " + " | ".join(f"wave {w}" for w in range(num_waves)) + " |"
    rule = "|---|---|---|" + "|".join("---" for _ in range(num_waves)) + "|"
    return "\n".join([header, rule, *rows])
