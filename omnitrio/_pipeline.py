"""The supervisor: ``open_pipeline`` owns the nursery, the actors and the streams.

Start-up runs the actors in pipeline order and waits for each to report ready
(its stage loaded on its thread), then the side stage (the turn detector) if the
config has one. Admission is bounded: beyond ``max_streams`` ``open_stream``
raises ``Overloaded`` at once. Leaving the block — normally, by exception or by
Ctrl-C — fails the streams still open with ``PipelineClosed``, cancels every
actor and joins every worker thread, within the configured
``shutdown_timeout_s``.

Here: the ``Pipeline`` (admission, streams, statistics) and ``open_pipeline``. Building
and starting the actors, Ray and the process-wide policies are ``_pipeline_start.py``;
the side stage's streams (``SideStream``) are ``_side_stream.py``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

from ._actor import StageActor
from ._config import PipelineConfig, load_config
from ._errors import Overloaded, PipelineClosed
from ._items import Request
from ._link import ClientLink, Link
from ._pipeline_start import SWITCH_INTERVAL_S as SWITCH_INTERVAL_S
from ._pipeline_start import build_actors, ray_if_placed, runtime_policies, start_actors
from ._pipeline_statistics import ShownPipeline
from ._scheduler import Playback
from ._side_stream import SIDE_INPUT_CAPACITY as SIDE_INPUT_CAPACITY
from ._side_stream import SIDE_INPUT_MAX_BYTES as SIDE_INPUT_MAX_BYTES
from ._side_stream import SIDE_ITEM_MAX_BYTES as SIDE_ITEM_MAX_BYTES
from ._side_stream import SideStream, SideStreams
from ._stream import DeliveryCounters, Stream, StreamHooks, StreamState
from .admission import (
    ACTIVE_WINDOW_S,
    Admission,
    AdmissionQueue,
    LiveStreams,
    declared_priors,
    plays_audio,
    priority_of,
)


class Pipeline(ShownPipeline):
    """A running pipeline. Made only by ``open_pipeline``. (``statistics()`` and
    ``occupancy()``: ``_pipeline_statistics.py``.)"""

    def __init__(
        self, config: PipelineConfig, actors: list[StageActor], side: StageActor | None
    ) -> None:
        self.config = config
        self._actors = actors
        self._by_name = {a.name: a for a in actors}
        self._side = side
        self._sides = SideStreams(side, config.pipeline.client_capacity)
        self._streams: dict[str, StreamState] = {}
        self._ids = itertools.count()
        self._closed = False
        self._num_admitted = 0
        self._num_refused = 0
        self._num_ended = 0  # admitted streams that failed or were cancelled, not yet released
        self._quiet: set[str] = set()  # live streams that play no audio (admission: cpu)
        self._outcomes = {"completed": 0, "failed": 0, "cancelled": 0}
        self._delivery = DeliveryCounters()
        section = config.pipeline
        self._hooks = StreamHooks(
            self._on_end,
            self._on_released,
            self._delivery,
            section.shutdown_timeout_s,
            Playback(section.client_buffer_s, section.first_audio_budget_s),
        )
        self._admission = Admission(
            section.max_streams,
            section.realtime_margin,
            headroom=section.admission == "headroom",
            client_buffer_s=section.client_buffer_s,
            busy=section.admission == "busy",
            warmup_streams=section.warmup_streams,
            cpu=section.admission == "cpu",
            hold_startups=section.admission == "cpu" and section.admission_wait_s > 0,
        )
        self._live = LiveStreams(
            self._streams,
            self._quiet,
            self._admission.startup.guards,
            section.first_audio_budget_s,
            hold_startups=self._admission.hold_startups,
        )
        self._queue = AdmissionQueue(
            section.admission_wait_s,
            section.admission_max_waiting,
            section.max_streams,
            section.admission_max_passes,
        )
        priors = declared_priors(config) if section.admission == "headroom" else {}
        for actor in actors:
            actor.on_round = self._after_round
            actor.step_model.ramp = section.warmup_streams is not None
            actor.step_model.prior = priors.get(actor.name)

    @asynccontextmanager
    async def open_stream(self, request: Request | str) -> AsyncIterator[Stream]:
        """Admit a stream and yield its handle; leaving the block cancels it if still running.

        Raises ``Overloaded`` when ``max_streams`` streams are open or a stage has no
        real-time headroom for one more (``omnitrio/admission/``): at once, or, with
        ``pipeline.admission_wait_s``, once a wait for room (bounded, first in first
        out, ``admission/_wait.py``) ran out; and ``PipelineClosed`` once the pipeline
        is shutting down. The request option ``priority`` (a number, default 0) orders
        shedding: lowest first. Leaving the block waits until every stage has freed the
        stream (the steps in progress plus at most one more); see ``Stream.aclose``.
        """
        request = Request(text=request) if isinstance(request, str) else request
        priority_of(request)  # a bad one is refused before it waits
        audio = self._plays_audio(request)
        unheld = partial(self.refusal, request, hold=False) if self._live.hold_startups else None
        try:
            state = await self._queue.admit(
                partial(self._admit, request),
                partial(self.refusal, request),
                audio=audio,
                unheld=unheld if audio else None,
            )
        except Overloaded as exc:
            self._num_refused += 1
            self._admission.num_refused_headroom += exc.problem is not None
            raise
        stream = Stream(state)
        try:
            yield stream
        finally:
            await stream.aclose()

    @property
    def is_full(self) -> bool:
        """True when ``open_stream`` of a request that plays audio would raise
        ``Overloaded`` at once, without waiting (or the pipeline is closing)."""
        return self.refuses()

    def refuses(self, request: Request | None = None) -> bool:
        """True when ``open_stream(request)`` would raise ``Overloaded`` at once, without
        waiting, or the pipeline is closing: the servers' look before a stream opens.
        Asked for ``request``'s kind (``refusal``): under ``admission: cpu`` a request
        that plays no audio (a transcription) is admitted beside audio streams that fill
        the cores, and is not held by the startup hold; None: one that plays audio."""
        audio = self._plays_audio(request)
        return self._closed or self._queue.refuses(self.refusal(request), audio)

    def queue_refusal(self) -> Overloaded:
        """Why ``refuses`` turned away a request the rule admits: the requests already
        waiting to be admitted fill the queue (``pipeline.admission_max_waiting``)."""
        return self._queue.full_refusal()

    def refusal(self, request: Request | None = None, *, hold: bool = True) -> Overloaded | None:
        """The ``Overloaded`` that ``open_stream`` would raise now (with its retry hint),
        or None if a stream would be admitted. Counts nothing. Each stage is charged
        its active streams (``StageActor.active_streams``) plus the new one; under
        ``admission: cpu`` the new stream is ``request``'s (one that plays audio where
        None). ``hold`` False: the answer but for the startup hold (``_guards.py``), the
        one guard that holds only streams that play audio."""
        streams = self._streams
        num_open = len(streams)
        oldest = next(iter(streams.values()), None)  # admitted first (dicts keep order)
        now_s = time.perf_counter()
        return self._admission.refusal(
            num_open - self._num_ended,
            num_open,
            ((a.name, a.step_model) for a in self._actors),
            self._delivery.audio_s_put,
            self._num_active,
            None if oldest is None else now_s - oldest.admitted_at_s,
            now_s,
            self._live.most_lag_s,
            self._live.least_slack_s,
            len(self._quiet),
            self._plays_audio(request),
            self._live.oldest_start_s if hold else None,
        )

    def _plays_audio(self, request: Request | None) -> bool:
        """Whether admission counts ``request``'s stream as one that plays audio: every
        stream does but under ``admission: cpu`` (``plays_audio``); None: one that does."""
        return request is None or self._admission.cpu is None or plays_audio(request)

    def _num_active(self, stage: str) -> int:
        actor = self._by_name[stage]
        return len(actor.active_streams(time.perf_counter(), ACTIVE_WINDOW_S))

    def _after_round(self, actor: StageActor) -> None:
        """A stage applied a round: admission may shed streams there
        (``Admission.after_round``)."""
        self._live.moved()  # its audio moved the streams' lags and deadlines
        self._queue.wake()
        admission = self._admission
        if not (admission.headroom or admission.busy or admission.cpu):
            return
        num_quiet = len(self._quiet)
        admission.after_round(
            actor.name,
            actor.step_model,
            len(actor.slots),
            actor.active_streams,
            self._delivery.audio_s_put,
            now_s=time.perf_counter(),
            busy_s=actor.counters.busy_s,
            num_late=actor.num_behind_now,
            num_audio=len(self._streams) - self._num_ended - num_quiet,
            num_quiet=num_quiet,
        )

    @property
    def side_stage(self) -> str | None:
        """The side stage's name (the config's ``side_stage``), or None."""
        return None if self._side is None else self._side.name

    @trio.lowlevel.enable_ki_protection
    def _admit(self, request: Request) -> StreamState:
        if self._closed:
            raise PipelineClosed("<new>")
        priority = priority_of(request)
        refusal = self.refusal(request)
        if refusal is not None:
            raise refusal  # counted by open_stream, once the wait (if any) is over
        stream_id = f"s{next(self._ids)}"
        actors = self._actors
        client = ClientLink(
            "client", self.config.pipeline.client_capacity, num_producers=len(actors)
        )
        edges: dict[str, Link] = {}
        for upstream, downstream in itertools.pairwise(actors):
            edge = self.config.edge_from(upstream.name)
            assert edge is not None  # the config guarantees a chain
            link = Link(edge.name, edge.capacity)
            link.consumer_wakeup = downstream.wakeup
            edges[edge.name] = link
        holders = frozenset(a.name for a in actors)
        stream = StreamState(stream_id, request, client, edges, holders, self._hooks)
        stream.priority = priority
        self._streams[stream_id] = stream
        audio = self._plays_audio(request)
        if not audio:
            self._quiet.add(stream_id)
        self._live.admitted(audio)
        self._num_admitted += 1
        links = list(edges.values())
        for index, actor in enumerate(actors):
            in_link = links[index - 1] if index > 0 else None
            out_link = links[index] if index < len(links) else None
            actor.add(stream, in_link, out_link)
        return stream

    @trio.lowlevel.enable_ki_protection
    def open_side_stream(self, request: Request) -> SideStream:
        """A stream on the side stage, outside admission (it is not a response).

        Raises ``PipelineClosed`` once the pipeline is shutting down and
        ``LookupError`` if the config has no side stage."""
        if self._closed:
            raise PipelineClosed("<new>")
        return self._sides.open(request, self._hooks)

    def _on_end(self, stream: StreamState) -> None:
        if self._sides.ended(stream.id):
            return
        self._num_ended += 1
        self._quiet.discard(stream.id)
        self._live.moved()
        self._queue.wake()
        for actor in self._actors:
            actor.drop(stream.id)

    def _on_released(self, stream: StreamState) -> None:
        if self._sides.released(stream.id):
            return
        del self._streams[stream.id]
        self._quiet.discard(stream.id)
        self._live.moved()
        self._queue.wake()
        if stream.ending:
            self._num_ended -= 1
        else:
            lifetime_s = time.perf_counter() - stream.admitted_at_s
            first_s = stream.first_audio_at_s
            startup_s = None if first_s is None else first_s - stream.admitted_at_s
            self._admission.completed(lifetime_s, stream.audio_s, stream.first_chunk_s, startup_s)
            for actor in self._actors:
                actor.step_model.completed(stream.num_steps_at.get(actor.name, 0), stream.audio_s)
        outcome = "failed" if stream.failure else "cancelled" if stream.cancelled else "completed"
        self._outcomes[outcome] += 1

    @trio.lowlevel.enable_ki_protection
    def _close(self) -> None:
        self._closed = True
        self._queue.close()
        for stream in [*self._streams.values(), *self._sides.streams()]:
            stream.fail(PipelineClosed(stream.id))


@asynccontextmanager
async def open_pipeline(config: PipelineConfig | str | os.PathLike[str]) -> AsyncIterator[Pipeline]:
    """Start every stage of ``config`` (a ``PipelineConfig`` or a YAML path) and yield the pipeline.

    Blocks until every stage has loaded, in pipeline order; a stage that fails
    to load raises ``StageLoadError`` (after stopping those already started).
    On exit, for any reason, open streams fail with ``PipelineClosed``, actors
    are cancelled and worker threads joined; this returns within
    ``pipeline.shutdown_timeout_s`` even if producers sit on full channels. A
    stage still stuck in a step past that deadline is logged with its streams.

    While any pipeline is open it changes process-wide settings, and puts them back
    when the last one closes: it runs a full collection, then ``gc.freeze()`` (what was
    allocated until then is no longer scanned by the collector, so a collection does
    not walk the loaded models on the trio thread), sets ``sys.setswitchinterval`` to
    ``SWITCH_INTERVAL_S`` (0.5 ms instead of 5 ms: a thread holding the GIL keeps the
    trio thread out for less), and adds a trio instrument (``max_trio_stall_s``).
    Code sharing the process sees these too.
    """
    if not isinstance(config, PipelineConfig):
        config = load_config(config)
    actors, side = build_actors(config)
    error: BaseException | None = None
    async with ray_if_placed(config), trio.open_nursery() as nursery:
        try:
            await start_actors(nursery, config, actors, side)
            pipeline = Pipeline(config, actors, side)
            async with runtime_policies():
                try:
                    yield pipeline
                finally:
                    pipeline._close()
        except BaseException as exc:
            # Held until the actors are down, then re-raised as it is: callers get
            # their own error (context intact), not an exception group.
            error = exc
        finally:
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error
