"""PNG plots of a benchmark (matplotlib, the optional ``bench`` extra).

Every figure is titled with the config, the targets and the commit; every y axis
starts at zero; wave numbers are whole; the zero-overhead bound from the stage
profile is drawn where the workload has one. With repetitions, a point is the
median over them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._report import RunReport


def write_plots(
    reports: Sequence[RunReport], folder: Path, context: dict[str, Any] | None = None
) -> list[Path]:
    """TTFA and throughput against concurrency, TTFA per wave, an audio timeline and,
    for open-loop runs, TTFA, continuity and refusals against the offered rate."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    workload = (context or {}).get("workload", {})
    commit = (context or {}).get("machine", {}).get("commit")
    targets = list(dict.fromkeys(r.run.target for r in reports))
    config = Path(workload.get("config", "")).name
    title = f"{config}, commit {commit or 'unknown'}\n{', '.join(targets)}"
    closed = [r for r in reports if math.isinf(r.run.request_rate)]
    opened = [r for r in reports if not math.isinf(r.run.request_rate)]
    written = []

    if closed:
        figure, (ttfa, tail, rate) = pyplot.subplots(1, 3, figsize=(14, 4.4))
        for target in targets:
            runs = [r for r in closed if r.run.target == target]
            levels = sorted({r.run.max_concurrency for r in runs})
            for axes, field in ((ttfa, "median"), (tail, "p99")):
                axes.plot(
                    levels,
                    [
                        statistics.median(
                            _ttfa_ms(r, field) for r in runs if r.run.max_concurrency == level
                        )
                        for level in levels
                    ],
                    marker="o",
                    label=target,
                )
            rate.plot(
                levels,
                _median_over(runs, levels, lambda r: r.aggregates.throughput.requests_per_s),
                marker="o",
                label=target,
            )
        ideal = {int(k): v for k, v in workload.get("ideal_ttfa_s", {}).items() if v is not None}
        for axes in (ttfa, tail) if ideal else ():
            axes.plot(list(ideal), [v * 1000 for v in ideal.values()], "k:", label="zero overhead")
        bound = {int(k): v for k, v in workload.get("zero_overhead_requests_per_s", {}).items()}
        if bound:
            rate.plot(list(bound), list(bound.values()), "k:", label="zero overhead")
        levels = sorted({r.run.max_concurrency for r in closed})
        for axes, label in (
            (ttfa, "TTFA p50 (ms)"),
            (tail, "TTFA p99 (ms)"),
            (rate, "completed requests per second"),
        ):
            axes.set_xscale("log", base=2)
            axes.set_xticks(levels, [str(level) for level in levels])
            _label(axes, "max concurrency (closed loop)", label)
        figure.suptitle(title, fontsize=8)
        written.append(_save(figure, folder / "ttfa_throughput_vs_concurrency.png"))

        waved = sorted(
            {r.run.max_concurrency for r in closed if len(r.aggregates.ttfa_by_wave) > 1}
        )
        figure, panes = pyplot.subplots(
            1, max(1, len(waved)), figsize=(4 * max(1, len(waved)), 4.4), squeeze=False
        )
        for axes, level in zip(panes[0], waved or [0], strict=True):
            for r in closed:
                waves = r.aggregates.ttfa_by_wave
                if r.run.max_concurrency == level and r.run.repetition == 0:
                    axes.plot(
                        list(waves),
                        [s.median * 1000 for s in waves.values()],
                        marker="o",
                        label=r.run.target,
                    )
            axes.set_title(f"c={level}, first repetition", fontsize=8)
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
            if axes.get_legend_handles_labels()[0]:
                _label(axes, "wave (rank of send time // concurrency)", "median TTFA (ms)")
        figure.suptitle(title, fontsize=8)
        written.append(_save(figure, folder / "ttfa_per_wave.png"))

        busiest = max(r.run.max_concurrency for r in closed)
        runs = [r for r in closed if r.run.max_concurrency == busiest and r.run.repetition == 0]
        figure, panes = pyplot.subplots(len(runs), 1, figsize=(9, 2.3 * len(runs)), squeeze=False)
        for pane, r in zip(panes[:, 0], runs, strict=True):
            for row, record in enumerate(r.run.records[:32]):
                start = record.sent_at_s
                end = start + (record.done_at_s or (record.audio[-1].at_s if record.audio else 0))
                pane.plot([start, end], [row, row], color="0.8", lw=1)
                arrivals = [start + c.at_s for c in record.audio]
                pane.scatter(arrivals, [row] * len(arrivals), marker="|", s=40, color="C0")
            pane.set_title(f"{r.run.target} c={busiest}: audio chunks per request", fontsize=8)
            pane.set_ylabel("request")
            pane.set_ylim(bottom=0)
            pane.set_xlim(left=0)
            pane.yaxis.set_major_locator(MaxNLocator(integer=True))
        panes[-1, 0].set_xlabel("seconds since the run started (grey: sent to done; tick: a chunk)")
        figure.suptitle(title, fontsize=8)
        written.append(_save(figure, folder / "audio_chunk_timeline.png"))

    if opened:
        figure, (ttfa, share) = pyplot.subplots(1, 2, figsize=(11, 4.4))
        for target in targets:
            runs = [r for r in opened if r.run.target == target]
            rates = sorted({r.run.request_rate for r in runs})
            ttfa.plot(rates, _median_over_rates(runs, rates, lambda r: _ttfa_ms(r, "p99")), "o-")
            ttfa.lines[-1].set_label(f"{target} p99")
            share.plot(
                rates,
                _median_over_rates(
                    runs, rates, lambda r: 100 * (r.aggregates.continuity_rate or 0)
                ),
                "o-",
                label=f"{target} continuity of admitted",
            )
            share.plot(
                rates,
                _median_over_rates(runs, rates, _refused_percent),
                "x--",
                label=f"{target} refused",
            )
        capacity = workload.get("capacity_requests_per_s")
        for axes, label in ((ttfa, "TTFA (ms)"), (share, "% of requests")):
            if capacity:
                axes.axvline(capacity, color="k", ls=":", label="computed capacity")
            _label(axes, "offered requests per second (open loop, Poisson)", label)
        figure.suptitle(title, fontsize=8)
        written.append(_save(figure, folder / "open_loop.png"))
    return written


def _label(axes: Any, x: str, y: str) -> None:
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=7)


def _median_over(
    runs: Sequence[RunReport], levels: list[int], value: Callable[[RunReport], float]
) -> list[float]:
    return [
        statistics.median(value(r) for r in runs if r.run.max_concurrency == level)
        for level in levels
    ]


def _median_over_rates(
    runs: Sequence[RunReport], rates: list[float], value: Callable[[RunReport], float]
) -> list[float]:
    return [statistics.median(value(r) for r in runs if r.run.request_rate == x) for x in rates]


def _ttfa_ms(report: RunReport, field: str) -> float:
    summary = report.aggregates.ttfa_s
    return float("nan") if summary is None else getattr(summary, field) * 1000


def _refused_percent(report: RunReport) -> float:
    a = report.aggregates
    total = a.num_completed + a.num_failed + a.num_refused
    return 100 * a.num_refused / total if total else 0.0


def _save(figure: object, path: Path) -> Path:
    figure.tight_layout()  # type: ignore[attr-defined]
    figure.savefig(path, dpi=110)  # type: ignore[attr-defined]
    from matplotlib import pyplot

    pyplot.close(figure)  # type: ignore[arg-type]
    return path
