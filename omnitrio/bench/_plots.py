"""PNG plots of a benchmark (matplotlib, the optional ``bench`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ._report import RunReport


def write_plots(reports: Sequence[RunReport], folder: Path) -> list[Path]:
    """TTFA and throughput against concurrency, TTFA per wave, and an audio timeline."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    folder.mkdir(parents=True, exist_ok=True)
    targets = list(dict.fromkeys(r.run.target for r in reports))
    written = []

    figure, (ttfa, rate) = pyplot.subplots(1, 2, figsize=(11, 4))
    for target in targets:
        runs = sorted((r for r in reports if r.run.target == target), key=_concurrency)
        levels = [r.run.max_concurrency for r in runs]
        ttfa.plot(levels, [_ms(r, "median") for r in runs], marker="o", label=f"{target} p50")
        ttfa.plot(levels, [_ms(r, "p99") for r in runs], marker="x", ls="--", label=f"{target} p99")
        rate.plot(
            levels, [r.aggregates.throughput.audio_s_per_s for r in runs], marker="o", label=target
        )
    for axes, label in ((ttfa, "TTFA (ms)"), (rate, "audio seconds per second")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("max concurrency")
        axes.set_ylabel(label)
        axes.legend(fontsize=7)
    written.append(_save(figure, folder / "ttfa_throughput_vs_concurrency.png"))

    figure, axes = pyplot.subplots(figsize=(7, 4))
    for r in reports:
        waves = r.aggregates.ttfa_by_wave
        if len(waves) > 1:
            axes.plot(
                list(waves),
                [s.median * 1000 for s in waves.values()],
                marker="o",
                label=f"{r.run.target} c={r.run.max_concurrency}",
            )
    axes.set_xlabel("wave (request index // concurrency)")
    axes.set_ylabel("median TTFA (ms)")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=7)
    written.append(_save(figure, folder / "ttfa_per_wave.png"))

    busiest = max(r.run.max_concurrency for r in reports)
    runs = [r for r in reports if r.run.max_concurrency == busiest]
    figure, panes = pyplot.subplots(len(runs), 1, figsize=(9, 2.2 * len(runs)), squeeze=False)
    for pane, r in zip(panes[:, 0], runs, strict=True):
        for row, record in enumerate(r.run.records[:32]):
            start = record.sent_at_s
            end = start + (record.done_at_s or (record.audio[-1].at_s if record.audio else 0.0))
            pane.plot([start, end], [row, row], color="0.8", lw=1)
            arrivals = [start + c.at_s for c in record.audio]
            pane.scatter(arrivals, [row] * len(arrivals), marker="|", s=40, color="C0")
        pane.set_title(f"{r.run.target} c={busiest}: audio chunks per request", fontsize=8)
        pane.set_ylabel("request")
    panes[-1, 0].set_xlabel("seconds since the run started (grey: sent to done; tick: a chunk)")
    written.append(_save(figure, folder / "audio_chunk_timeline.png"))
    return written


def _concurrency(report: RunReport) -> int:
    return report.run.max_concurrency


def _ms(report: RunReport, field: str) -> float:
    summary = report.aggregates.ttfa_s
    return float("nan") if summary is None else getattr(summary, field) * 1000


def _save(figure: object, path: Path) -> Path:
    figure.tight_layout()  # type: ignore[attr-defined]
    figure.savefig(path, dpi=110)  # type: ignore[attr-defined]
    from matplotlib import pyplot

    pyplot.close(figure)  # type: ignore[arg-type]
    return path
