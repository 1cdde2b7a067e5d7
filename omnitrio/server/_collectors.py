"""The server's Prometheus collectors: what ``/metrics`` reads off the pipeline, the
per-client limits and the side stage at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._pipeline import Pipeline
from .._statistics import AdmissionWaitStatistics
from ._shares import ClientShares
from ._side_stage import SideStage


class SharesCollector(Collector):
    """The per-client limits and the most any one client holds, read at scrape time."""

    def __init__(self, shares: ClientShares) -> None:
        self._shares = shares

    def collect(self) -> Iterator[Metric]:
        shares = self._shares
        for name, text, limit, counts in (
            ("streams", "pipeline streams", shares.max_streams, shares.streams),
            ("queued", "requests being checked", shares.max_queued, shares.queued),
        ):
            held = GaugeMetricFamily(
                f"omnitrio_client_{name}_max", f"The most {text} any one client holds now."
            )
            held.add_metric([], max(counts.values(), default=0))
            cap = GaugeMetricFamily(
                f"omnitrio_client_{name}_limit",
                f"The {text} one client may hold (max_{name}_per_client).",
            )
            cap.add_metric([], limit)
            yield from (held, cap)
        clients = GaugeMetricFamily(
            "omnitrio_clients_with_streams", "Clients (addresses) with a stream open."
        )
        clients.add_metric([], len(shares.streams))
        yield clients


class SideStageCollector(Collector):
    """The side stage's work (the turn detector), read at scrape time."""

    def __init__(self, side_stage: SideStage) -> None:
        self._side_stage = side_stage

    def collect(self) -> Iterator[Metric]:
        stats = self._side_stage.statistics()
        busy = CounterMetricFamily(
            "omnitrio_side_stage_busy_seconds", "Time the side stage spent in steps."
        )
        busy.add_metric([], stats.busy_s)
        steps = CounterMetricFamily("omnitrio_side_stage_steps", "Side stage steps.")
        steps.add_metric([], stats.num_steps)
        streams = GaugeMetricFamily(
            "omnitrio_side_stage_streams", "Sessions the side stage listens to."
        )
        streams.add_metric([], stats.num_open_streams)
        yield from (busy, steps, streams)


class PipelineCollector(Collector):
    """Pipeline statistics, read at scrape time."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        stats = self._pipeline.statistics()
        open_streams = GaugeMetricFamily("omnitrio_open_streams", "Streams admitted, not released.")
        open_streams.add_metric([], stats.num_open_streams)
        yield open_streams
        gauges = {
            "queue_depth": (
                "omnitrio_stage_queue_depth",
                "Payloads waiting on a stage's input edge.",
            ),
            "batch": ("omnitrio_stage_last_batch_size", "Streams in the stage's latest step."),
            "mean_batch": ("omnitrio_stage_mean_batch_size", "Mean streams per step."),
            "step_time": ("omnitrio_stage_mean_step_seconds", "Mean time per step."),
            "hung": ("omnitrio_stage_hung", "1 when a step outlived the stage's step_timeout_s."),
            "model_intercept": (
                "omnitrio_stage_model_intercept_seconds",
                "Learned step time: the part that does not grow with the batch.",
            ),
            "model_per_stream": (
                "omnitrio_stage_model_per_stream_seconds",
                "Learned step time added per stream in the batch.",
            ),
            "model_scale": (
                "omnitrio_stage_model_scale",
                "Recent steps' time over the learned line's (above 1: slower lately).",
            ),
            "model_first_step_share": (
                "omnitrio_stage_model_first_step_share",
                "Share of the stage's time its streams' first steps (prefills) take.",
            ),
            "realtime_streams": (
                "omnitrio_stage_realtime_streams",
                "The most streams the stage keeps in real time now (0: no estimate yet).",
            ),
            "steps_to_first_step": (
                "omnitrio_stage_max_steps_to_first_step",
                "The most of the stage's steps a stream waited for its first step there, "
                "from its first input, its own step included (0: none yet).",
            ),
        }
        # Totals since start are counters: exported as <name>_total.
        counters = {
            "steps": ("omnitrio_stage_steps", "Steps run by the stage."),
            "busy": (
                "omnitrio_stage_busy_seconds",
                "Time the stage's thread spent in stage calls.",
            ),
        }
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            k: GaugeMetricFamily(n, h, labels=["stage"]) for k, (n, h) in gauges.items()
        }
        families.update(
            {k: CounterMetricFamily(n, h, labels=["stage"]) for k, (n, h) in counters.items()}
        )
        for name, stage in stats.stages.items():
            families["queue_depth"].add_metric([name], sum(stage.queue_depth.values()))
            families["batch"].add_metric([name], stage.last_batch_size)
            families["mean_batch"].add_metric([name], stage.mean_batch_size)
            families["steps"].add_metric([name], stage.num_steps)
            families["busy"].add_metric([name], stage.busy_s)
            mean_step = stage.busy_s / stage.num_steps if stage.num_steps else 0.0
            families["step_time"].add_metric([name], mean_step)
            families["hung"].add_metric([name], 1.0 if stage.hung else 0.0)
            families["steps_to_first_step"].add_metric([name], stage.max_steps_to_first_step)
            model = stage.step_model
            if model is not None:
                families["model_intercept"].add_metric([name], model.intercept_s)
                families["model_per_stream"].add_metric([name], model.per_stream_s)
                families["model_scale"].add_metric([name], model.scale)
                families["model_first_step_share"].add_metric([name], model.first_step_share)
                families["realtime_streams"].add_metric([name], model.realtime_streams)
        yield from families.values()
        totals = CounterMetricFamily(
            "omnitrio_streams", "Streams by outcome since start.", labels=["outcome"]
        )
        for outcome, count in (
            ("completed", stats.num_completed),
            ("failed", stats.num_failed),
            ("cancelled", stats.num_cancelled),
            ("refused", stats.num_refused),
            ("refused_headroom", stats.num_refused_headroom),
            ("shed", stats.num_shed),
        ):
            totals.add_metric([outcome], count)
        yield totals
        yield from _admission_waits(stats.admission_waits)


def _admission_waits(waits: AdmissionWaitStatistics) -> Iterator[Metric]:
    """Requests that waited to be admitted (``pipeline.admission_wait_s``)."""
    ended = CounterMetricFamily(
        "omnitrio_admission_waits",
        "Requests that waited to be admitted, by how the wait ended (left: the client went).",
        labels=["outcome"],
    )
    for outcome, count in (
        ("admitted", waits.num_admitted),
        ("refused", waits.num_refused),
        ("left", waits.num_left),
    ):
        ended.add_metric([outcome], count)
    seconds = CounterMetricFamily(
        "omnitrio_admission_wait_seconds", "Seconds requests waited to be admitted, in all."
    )
    seconds.add_metric([], waits.wait_s)
    longest = GaugeMetricFamily(
        "omnitrio_admission_longest_wait_seconds", "The longest single wait to be admitted."
    )
    longest.add_metric([], waits.longest_s)
    waiting = GaugeMetricFamily("omnitrio_admission_waiting", "Requests waiting to be admitted.")
    waiting.add_metric([], waits.num_waiting)
    yield from (ended, seconds, longest, waiting)
