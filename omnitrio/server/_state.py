"""What the web layer shares across requests: the pipeline, settings, counters, metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sized
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._errors import Overloaded
from .._heap import HeapTrims
from .._items import Request
from .._options import ResponseOptions
from .._pipeline import Pipeline
from .._statistics import AdmissionWaitStatistics
from .._stream import Stream
from ._api_errors import retry_after_s as retry_after_s
from ._client_totals import ClientTotals
from ._idle_sessions import IdleSessions
from ._secrets import ClientSecrets
from ._settings import ServerSettings
from ._shares import ClientShares
from ._side_stage import SideStage

logger = logging.getLogger("omnitrio.server")

SESSION_LOOK = Request(options=ResponseOptions(modalities=("text",)))
"""What a Realtime session's look at connect asks admission for: a response that plays
no audio (under ``admission: cpu`` the kind admitted beside audio streams that fill the
cores; ``ServerState.session_busy``). A WebRTC call, which is voice, asks as for audio."""

Busy = Literal["draining", "overloaded"]


@dataclass
class ServerState:
    pipeline: Pipeline
    settings: ServerSettings
    draining: bool = False
    side_stage: SideStage | None = None
    """Runs server_vad turn detection when the pipeline config names a detector."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    calls: Sized | None = None
    """The WebRTC calls (``serve`` opens them around the HTTP server: a ``_calls.Calls``,
    which this module does not import, as it imports this one)."""

    def __post_init__(self) -> None:
        self.secrets = ClientSecrets(
            self.settings.client_secret_s, self.settings.max_client_secrets
        )
        self.calls_started = Counter(
            "omnitrio_webrtc_calls",
            "WebRTC calls answered (POST /v1/realtime/calls).",
            registry=self.registry,
        )
        self.ttfa_s = Histogram(
            "omnitrio_time_to_first_audio_seconds",
            "Time from a response's start to its first audio chunk.",
            buckets=(0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        calls_up = Gauge("omnitrio_webrtc_calls_up", "WebRTC calls up now.", registry=self.registry)
        calls_up.set_function(lambda: 0 if self.calls is None else len(self.calls))
        self.refusals = Counter(
            "omnitrio_refusals",
            "Requests or connections refused at once (overload, draining, limits).",
            ["reason"],
            registry=self.registry,
        )
        self.connections = Counter(
            "omnitrio_websocket_connections",
            "Realtime WebSocket connections accepted.",
            registry=self.registry,
        )
        self.speculations = Counter(
            "omnitrio_speculative_answers",
            "Answers started at a pause in speech: taken by the turn's response, or dropped.",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("taken", "dropped"):
            self.speculations.labels(outcome)  # exported from 0
        settings = self.settings
        self.shares = ClientShares(
            settings.streams_per_client(self.pipeline.config.pipeline.max_streams),
            settings.max_queued_per_client,
            settings.max_checking_threads,
            settings.decode_timeout_s,
        )
        self.totals = ClientTotals(settings.max_client_held_bytes, settings.max_sessions_per_key)
        self.idle_sessions = IdleSessions(settings.crowded_idle_s)
        trims = Counter(
            "omnitrio_heap_trims",
            "Freed heap handed back to the system after big requests or sessions ended.",
            registry=self.registry,
        )
        self.heap_trims = HeapTrims(on_trim=trims.inc)
        self.registry.register(_SharesCollector(self.shares))
        self.registry.register(_PipelineCollector(self.pipeline))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and the like
        if self.side_stage is not None:
            self.registry.register(_SideStageCollector(self.side_stage))

    @property
    def model_name(self) -> str:
        return self.pipeline.config.pipeline.name

    def busy(self, request: Request | None = None) -> Busy | None:
        """The one look before a stream or a session opens: why none may now
        (draining first, then a full pipeline), or None. Asked for ``request``'s kind
        (``Pipeline.refuses``: a transcription is not refused for the audio streams'
        room); None: one that plays audio (a session asks ``session_busy``)."""
        if self.draining:
            return "draining"
        return "overloaded" if self.pipeline.refuses(request) else None

    def session_busy(self) -> Busy | None:
        """The look before a Realtime session opens: why none may now (draining, or
        the pipeline would refuse at once even a response that plays no audio,
        ``SESSION_LOOK``), or None. Its responses are not known yet, and each is
        admitted or refused as it is asked for (a refused one ends ``failed`` with
        ``retry_after_ms``), so a session used for text or transcription alone is not
        refused for the audio streams' room; ``refuse(reason, SESSION_LOOK)`` answers it."""
        return self.busy(SESSION_LOOK)

    def refuse(
        self, reason: Busy, request: Request | None = None, refusal: Overloaded | None = None
    ) -> Overloaded:
        """Count a refusal for ``reason``; the ``Overloaded`` to answer it with: ``refusal``
        where the pipeline already raised it, else the pipeline's own for ``request``
        (with its retry estimate, where it has one), else, overloaded, the full wait
        queue's (a request the rule admits but the requests waiting fill the queue)."""
        self.refusals.labels(reason).inc()
        pipeline = self.pipeline
        refusal = refusal or pipeline.refusal(request)
        if refusal is not None:
            return refusal
        if reason == "overloaded":
            return pipeline.queue_refusal()
        return Overloaded(pipeline.config.pipeline.max_streams)

    @asynccontextmanager
    async def open_stream(self, client: str, request: Request) -> AsyncIterator[Stream]:
        """A pipeline stream counted in ``client``'s share (``ShareExceeded`` past it)."""
        with self.shares.stream(client):
            async with self.pipeline.open_stream(request) as stream:
                yield stream


class ResponseLog:
    """Times one response: feeds the TTFA histogram and logs one line when it ends."""

    def __init__(self, state: ServerState, kind: str, response_id: str) -> None:
        self._state = state
        self._what = f"{kind} {response_id}"
        self._started = trio.current_time()
        self.first_audio_s: float | None = None

    def audio(self) -> None:
        if self.first_audio_s is None:
            self.first_audio_s = trio.current_time() - self._started
            self._state.ttfa_s.observe(self.first_audio_s)

    def done(self, status: str) -> None:
        ttfa = "none" if self.first_audio_s is None else f"{self.first_audio_s * 1000:.0f} ms"
        total_ms = (trio.current_time() - self._started) * 1000
        logger.info("%s %s: first audio %s, took %.0f ms", self._what, status, ttfa, total_ms)


class _SharesCollector(Collector):
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


class _SideStageCollector(Collector):
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


class _PipelineCollector(Collector):
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
