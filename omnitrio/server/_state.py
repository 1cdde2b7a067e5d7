"""What the web layer shares across requests: the pipeline, settings, counters, metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sized
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from .._errors import Overloaded
from .._heap import HeapTrims
from .._items import Request
from .._options import ResponseOptions
from .._pipeline import Pipeline
from .._stream import Stream
from ._api_errors import retry_after_s as retry_after_s
from ._client_totals import ClientTotals
from ._collectors import PipelineCollector, SharesCollector, SideStageCollector
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


class Draining(Overloaded):
    """A new stream or session refused because the server is draining (it stops once
    the streams it serves end): not the pipeline's room, so neither its ``max_streams``
    nor its headroom is named, and no retry estimate (this server will not have room
    again; HTTP's Retry-After says its default)."""

    def __init__(self, max_streams: int) -> None:
        super().__init__(max_streams)
        self.args = (
            "the server is draining (shutting down): it opens no new streams or sessions; "
            "retry on another server or once it has restarted",
        )

    def __reduce__(self) -> tuple[type[Draining], tuple[int]]:  # type: ignore[override]
        return (Draining, (self.max_streams,))


class Quieting(Protocol):
    """A Realtime session being served (``_realtime.RealtimeConnection``)."""

    def end_when_quiet(self) -> None: ...


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
    sessions: set[Quieting] = field(default_factory=set)
    """The Realtime sessions being served, over a WebSocket or a WebRTC call: a drain
    ends each once it is quiet (``drain``)."""

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
        self.registry.register(SharesCollector(self.shares))
        self.registry.register(PipelineCollector(self.pipeline))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and the like
        if self.side_stage is not None:
            self.registry.register(SideStageCollector(self.side_stage))

    def drain(self) -> None:
        """The server drains (``serve``, on a signal): nothing new opens (``busy``), and
        each Realtime session ends once it is quiet, an idle one at once
        (``RealtimeConnection.end_when_quiet``; a call not yet connected is ended by the
        calls, ``Calls.drain``)."""
        self.draining = True
        for session in list(self.sessions):
            session.end_when_quiet()

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
        """Count a refusal for ``reason``; the ``Overloaded`` to answer it with: draining,
        ``Draining``; else ``refusal`` where the pipeline already raised it, else the
        pipeline's own for ``request`` (with its retry estimate, where it has one), else
        the full wait queue's (a request the rule admits but the requests waiting fill
        the queue)."""
        self.refusals.labels(reason).inc()
        pipeline = self.pipeline
        if reason == "draining":
            return Draining(pipeline.config.pipeline.max_streams)
        return refusal or pipeline.refusal(request) or pipeline.queue_refusal()

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
