"""The supervisor: ``open_pipeline`` owns the nursery, the actors and the streams.

Start-up runs the actors in pipeline order and waits for each to report ready
(its stage loaded on its thread), then the side stage (the turn detector) if the
config has one. Admission is bounded: beyond ``max_streams`` ``open_stream``
raises ``Overloaded`` at once. Leaving the block — normally, by exception or by
Ctrl-C — fails the streams still open with ``PipelineClosed``, cancels every
actor and joins every worker thread, within the configured
``shutdown_timeout_s``.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from types import MappingProxyType

import trio

from ._actor import StageActor, stage_statistics
from ._config import PipelineConfig, StageSpec, check_stage_limits, load_config, uses_ray
from ._errors import Overloaded, PipelineClosed
from ._items import Request
from ._link import ClientLink, Link
from ._scheduler import Playback
from ._statistics import Occupancy, PipelineStatistics
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

logger = logging.getLogger(__name__)

SIDE_INPUT_CAPACITY = 256
"""Inputs one side stream may have waiting for its stage (~5 s of 20 ms audio chunks)."""
SIDE_INPUT_MAX_BYTES = 10 * 48_000
"""Bytes one side stream may have waiting: 10 s of the Realtime session's PCM16 (24 kHz)."""
SIDE_ITEM_MAX_BYTES = 9_600
"""The most one side input holds (longer bytes are queued in pieces): 0.2 s of it."""


class SideStream:
    """One stream on the side stage: ``append`` inputs, iterate ``stream`` for its items.

    The side stage (the turn detector) is not on the chain: the caller feeds the
    stream's input edge itself and reads its client link. Made by
    ``Pipeline.open_side_stream``; ``close()`` frees it on the stage at its next turn.

    Bytes inputs (PCM16 audio) are bounded by their size, not only by their number: one
    longer than ``SIDE_ITEM_MAX_BYTES`` is queued as pieces of at most that (cut at an
    even offset, a whole sample), so a stage that takes a few inputs a step
    (``max_inputs_per_step``) scores a bounded amount a step; and at most
    ``SIDE_INPUT_MAX_BYTES`` wait per stream, past which inputs are dropped (a session
    appending megabyte frames as fast as it could held the detector's step past its
    watchdog, and a gigabyte).
    """

    def __init__(self, state: StreamState, in_link: Link) -> None:
        self.id = state.id
        self.stream = Stream(state)
        self._state = state
        self._inbox = in_link
        self.num_dropped = 0
        self._sizes: deque[tuple[int, int]] = deque()  # (put index, bytes) not yet taken
        self._queued_bytes = 0

    def append(self, item: object) -> bool:
        """Queue one input for the stage's next step. Never blocks: if the stage is
        ``SIDE_INPUT_CAPACITY`` inputs or ``SIDE_INPUT_MAX_BYTES`` behind, the input is
        dropped (logged) and this returns False. Inputs after the stream ended are
        ignored."""
        if self._inbox.discarded:
            return False
        if not isinstance(item, bytes):
            return self._put(item, 0)
        self._forget_taken()
        if self._queued_bytes + len(item) > SIDE_INPUT_MAX_BYTES:
            return self._drop()
        step = SIDE_ITEM_MAX_BYTES
        pieces = [item[start : start + step] for start in range(0, len(item), step)] or [item]
        if self._inbox.free < len(pieces):
            return self._drop()
        return all([self._put(piece, len(piece)) for piece in pieces])

    def _put(self, item: object, num_bytes: int) -> bool:
        if self._inbox.free < 1:
            return self._drop()
        self._sizes.append((self._inbox.num_put, num_bytes))
        self._queued_bytes += num_bytes
        self._inbox.put((item,))
        return True

    def _drop(self) -> bool:
        self.num_dropped += 1
        logger.warning("side stage is behind; dropped an input", extra={"stream": self.id})
        return False

    def _forget_taken(self) -> None:
        taken = self._inbox.num_taken
        while self._sizes and self._sizes[0][0] < taken:
            self._queued_bytes -= self._sizes.popleft()[1]

    @property
    def queued_bytes(self) -> int:
        """Bytes of input waiting for the stage."""
        self._forget_taken()
        return self._queued_bytes

    def close(self) -> None:
        """Stop it (idempotent); the stage frees it at its next turn."""
        self._state.cancel()


class Pipeline:
    """A running pipeline. Made only by ``open_pipeline``."""

    def __init__(
        self, config: PipelineConfig, actors: list[StageActor], side: StageActor | None
    ) -> None:
        self.config = config
        self._actors = actors
        self._by_name = {a.name: a for a in actors}
        self._side = side
        self._streams: dict[str, StreamState] = {}
        self._side_streams: dict[str, StreamState] = {}
        self._ids = itertools.count()
        self._side_ids = itertools.count()
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
        side = self._side
        if side is None:
            raise LookupError("the pipeline has no side stage (the config's side_stage)")
        if self._closed:
            raise PipelineClosed("<new>")
        stream_id = f"{side.name}{next(self._side_ids)}"
        in_link = Link(f"->{side.name}", SIDE_INPUT_CAPACITY)
        in_link.consumer_wakeup = side.wakeup
        client = ClientLink("client", self.config.pipeline.client_capacity)
        stream = StreamState(
            stream_id, request, client, {in_link.name: in_link}, frozenset({side.name}), self._hooks
        )
        self._side_streams[stream_id] = stream
        side.add(stream, in_link, None)
        return SideStream(stream, in_link)

    def _on_end(self, stream: StreamState) -> None:
        if stream.id in self._side_streams:
            assert self._side is not None
            self._side.drop(stream.id)
            return
        self._num_ended += 1
        self._quiet.discard(stream.id)
        self._live.moved()
        self._queue.wake()
        for actor in self._actors:
            actor.drop(stream.id)

    def _on_released(self, stream: StreamState) -> None:
        if self._side_streams.pop(stream.id, None) is not None:
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
        for stream in [*self._streams.values(), *self._side_streams.values()]:
            stream.fail(PipelineClosed(stream.id))

    def statistics(self) -> PipelineStatistics:
        """A frozen snapshot of every stage and stream. Never blocks, but works out every
        stage's admission model and every stream's links on the trio thread (a
        millisecond or more at 64 streams): a sampler that needs only the counts asks
        ``occupancy()``."""
        actors = self._actors
        audio_s = self._delivery.audio_s_put
        cap = self.config.pipeline.max_streams
        needed = self._admission.needed_at  # what admission asks: realtime_streams counts at it
        stages = stage_statistics({a.name: a for a in actors}, audio_s, cap, needed)
        return PipelineStatistics(
            stages=stages,
            streams=MappingProxyType({s.id: s.statistics() for s in self._streams.values()}),
            num_open_streams=len(self._streams),
            max_streams=self.config.pipeline.max_streams,
            num_admitted=self._num_admitted,
            num_refused=self._num_refused,
            num_refused_headroom=self._admission.num_refused_headroom,
            num_shed=self._admission.num_shed,
            audio_s_delivered=audio_s,
            num_completed=self._outcomes["completed"],
            num_failed=self._outcomes["failed"],
            num_cancelled=self._outcomes["cancelled"],
            num_payloads_routed=sum(a.counters.num_payloads_sent for a in actors),
            num_payload_bytes_relayed=sum(s.num_payload_bytes_relayed for s in stages.values()),
            num_items_delivered=self._delivery.num_delivered,
            num_payloads_to_client=self._delivery.num_non_visible_seen,
            side_stage=None if self._side is None else self._side.statistics(),
            max_trio_stall_s=_stall_meter.max_stall_s,
            admission_waits=self._queue.statistics(),
        )

    def occupancy(self) -> Occupancy:
        """Open streams, and each stage's waiting payloads and latest batch: the counts
        ``omnitrio bench`` samples every 0.1 s during a run. Far cheaper than
        ``statistics()``, which works out every stage's model and every stream's links
        on the trio thread (the run's own clients and stages wait meanwhile)."""
        actors = self._actors
        depth = {
            a.name: sum(
                (s.in_link.buffered if s.in_link else 0) + len(s.carry) for s in a.slots.values()
            )
            for a in actors
        }
        batch = {a.name: a.counters.last_batch_size for a in actors}
        return Occupancy(len(self._streams), MappingProxyType(depth), MappingProxyType(batch))


class _StallMeter(trio.abc.Instrument):
    """The longest single task step on the trio thread (GC pauses included): while one
    runs, no other task, actor or client, moves."""

    def __init__(self) -> None:
        self.max_stall_s = 0.0
        self._started: float | None = None
        self.users = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._started is None:
            return  # the step that installed the meter
        stall_s = time.perf_counter() - self._started
        if stall_s > self.max_stall_s:
            self.max_stall_s = stall_s


_stall_meter = _StallMeter()

SWITCH_INTERVAL_S = 0.5e-3
"""``sys.setswitchinterval`` while pipelines run (CPython's default is 5 ms): how long
a thread holding the GIL keeps one that waits for it out. Every hand-off between
stages goes through the trio thread; with a stage that computes in Python holding
the GIL, trio would wait up to the whole default interval for each (``omnitrio bench
--cpu-bound``: 0.9x the orchestrator shape's requests/s at 5 ms, 1.2-1.5x at 0.5 ms,
``docs/benchmarks.md``)."""

_saved_switch_interval_s: float | None = None


@asynccontextmanager
async def _runtime_policies() -> AsyncIterator[None]:
    """While any pipeline runs, three process-wide policies, undone when the last one
    closes: what start-up allocated (modules, models, configs) frozen out of the
    collector's way (``gc.freeze``), so a gen-2 collection no longer walks it on the
    trio thread; the stall meter on (from after that collection); and the GIL's
    switch interval at ``SWITCH_INTERVAL_S``."""
    global _saved_switch_interval_s
    if _stall_meter.users == 0:
        gc.collect()
        gc.freeze()
        _saved_switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        _stall_meter.max_stall_s = 0.0
        _stall_meter._started = None
        trio.lowlevel.add_instrument(_stall_meter)
    _stall_meter.users += 1
    try:
        yield
    finally:
        _stall_meter.users -= 1
        if _stall_meter.users == 0:
            gc.unfreeze()
            if _saved_switch_interval_s is not None:
                sys.setswitchinterval(_saved_switch_interval_s)
                _saved_switch_interval_s = None
            trio.lowlevel.remove_instrument(_stall_meter)


async def _start(
    nursery: trio.Nursery,
    actor: StageActor,
    check: Callable[[int, int], None],
    shutdown_timeout_s: float,
) -> None:
    async def run(*, task_status: trio.TaskStatus[None]) -> None:
        try:
            limits = await actor.load()
            check(limits.max_payloads_per_step, limits.max_visible_per_step)
            task_status.started()
            await actor.serve()
        finally:
            await actor.shutdown(shutdown_timeout_s)

    await nursery.start(run)


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
    source = config.source
    specs = config.stages
    actors = [
        StageActor(
            spec,
            source,
            scheduling=config.pipeline.scheduling,
            feeds_edge=config.edge_from(spec.name) is not None,
            payloads_by_reference=spec.placement == "ray"
            and index + 1 < len(specs)
            and specs[index + 1].placement == "ray",
        )
        for index, spec in enumerate(specs)
    ]
    for upstream, downstream in itertools.pairwise(actors):
        upstream.downstream = downstream
    side_spec: StageSpec | None = config.side_stage
    side = None if side_spec is None else StageActor(side_spec, source, feeds_edge=False)
    timeout_s = config.pipeline.shutdown_timeout_s
    error: BaseException | None = None
    async with _ray_if_placed(config), trio.open_nursery() as nursery:
        try:
            for actor in [*actors, *([side] if side else [])]:
                check = _checker(config, actor.name, on_chain=actor is not side)
                await _start(nursery, actor, check, timeout_s)
            pipeline = Pipeline(config, actors, side)
            async with _runtime_policies():
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


@asynccontextmanager
async def _ray_if_placed(config: PipelineConfig) -> AsyncIterator[None]:
    """Ray around the pipeline if a stage has ``placement: ray`` (only then is it imported)."""
    if not uses_ray(config):
        yield
        return
    from ._ray_cluster import open_ray

    async with open_ray(config):
        yield


def _checker(config: PipelineConfig, stage: str, *, on_chain: bool) -> Callable[[int, int], None]:
    def check(max_payloads_per_step: int, max_visible_per_step: int) -> None:
        payloads = max_payloads_per_step if on_chain else 0
        check_stage_limits(config, stage, payloads, max_visible_per_step)

    return check
