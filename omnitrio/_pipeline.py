"""The supervisor: ``open_pipeline`` owns the nursery, the actors and the streams.

Start-up runs the actors in pipeline order and waits for each to report ready
(its stage loaded on its thread). Admission is bounded: beyond ``max_streams``
``open_stream`` raises ``Overloaded`` at once. Leaving the block — normally, by
exception or by Ctrl-C — fails the streams still open with ``PipelineClosed``,
cancels every actor and joins every worker thread, within the configured
``shutdown_timeout_s``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import MappingProxyType

import trio

from ._actor import StageActor
from ._config import PipelineConfig, load_config
from ._errors import Overloaded, PipelineClosed
from ._items import Request
from ._link import Link
from ._statistics import PipelineStatistics, StageStatistics, StreamStatistics
from ._stream import DeliveryCounters, Stream


class Pipeline:
    """A running pipeline. Made only by ``open_pipeline``."""

    def __init__(self, config: PipelineConfig, actors: list[StageActor]) -> None:
        self.config = config
        self._actors = actors
        self._streams: dict[str, Stream] = {}
        self._ids = itertools.count()
        self._closed = False
        self._num_admitted = 0
        self._num_refused = 0
        self._outcomes = {"completed": 0, "failed": 0, "cancelled": 0}
        self._delivery = DeliveryCounters()

    @asynccontextmanager
    async def open_stream(self, request: Request | str) -> AsyncIterator[Stream]:
        """Admit a stream and yield its handle; leaving the block cancels it if still running.

        Raises ``Overloaded`` at once (no queueing) when ``max_streams`` streams
        are open, and ``PipelineClosed`` once the pipeline is shutting down.
        Leaving the block waits until every stage has freed the stream (the step
        in progress plus at most one more); see ``Stream.aclose``.
        """
        stream = self._admit(Request(text=request) if isinstance(request, str) else request)
        try:
            yield stream
        finally:
            await stream.aclose()

    @property
    def is_full(self) -> bool:
        """True when ``open_stream`` would raise ``Overloaded`` (or the pipeline is closing)."""
        return self._closed or len(self._streams) >= self.config.pipeline.max_streams

    @trio.lowlevel.enable_ki_protection
    def _admit(self, request: Request) -> Stream:
        if self._closed:
            raise PipelineClosed("<new>")
        max_streams = self.config.pipeline.max_streams
        if len(self._streams) >= max_streams:
            self._num_refused += 1
            raise Overloaded(max_streams)
        stream_id = f"s{next(self._ids)}"
        actors = self._actors
        client = Link("client", self.config.pipeline.client_capacity, num_producers=len(actors))
        client.producer_wakeups = [a.wakeup for a in actors]
        edges: dict[str, Link] = {}
        for upstream, downstream in itertools.pairwise(actors):
            edge = self.config.edge_from(upstream.name)
            assert edge is not None  # the config guarantees a chain
            link = Link(edge.name, edge.capacity)
            link.producer_wakeups = [upstream.wakeup]
            link.consumer_wakeup = downstream.wakeup
            edges[edge.name] = link
        stream = Stream(
            stream_id,
            request,
            client,
            edges,
            frozenset(a.name for a in actors),
            self._on_end,
            self._on_released,
            self._delivery,
            self.config.pipeline.shutdown_timeout_s,
        )
        self._streams[stream_id] = stream
        self._num_admitted += 1
        links = list(edges.values())
        for index, actor in enumerate(actors):
            inbox = links[index - 1] if index > 0 else None
            outbox = links[index] if index < len(links) else None
            actor.add(stream, inbox, outbox)
        return stream

    def _on_end(self, stream: Stream) -> None:
        for actor in self._actors:
            actor.drop(stream.id)

    def _on_released(self, stream: Stream) -> None:
        del self._streams[stream.id]
        outcome = "failed" if stream.failure else "cancelled" if stream.cancelled else "completed"
        self._outcomes[outcome] += 1

    @trio.lowlevel.enable_ki_protection
    def _close(self) -> None:
        self._closed = True
        for stream in list(self._streams.values()):
            stream.fail(PipelineClosed(stream.id))

    def statistics(self) -> PipelineStatistics:
        """A frozen snapshot of every stage and stream. Cheap; never blocks."""
        streams = self._streams.values()
        return PipelineStatistics(
            stages=MappingProxyType({a.name: _stage_statistics(a) for a in self._actors}),
            streams=MappingProxyType({s.id: _stream_statistics(s) for s in streams}),
            num_open_streams=len(self._streams),
            max_streams=self.config.pipeline.max_streams,
            num_admitted=self._num_admitted,
            num_refused=self._num_refused,
            num_completed=self._outcomes["completed"],
            num_failed=self._outcomes["failed"],
            num_cancelled=self._outcomes["cancelled"],
            num_payloads_routed=sum(a.counters.num_payloads_sent for a in self._actors),
            num_items_delivered=self._delivery.num_delivered,
            num_payloads_to_client=self._delivery.num_non_visible_seen,
        )


def _stage_statistics(actor: StageActor) -> StageStatistics:
    c = actor.counters
    return StageStatistics(
        name=actor.name,
        num_open_streams=len(actor.slots),
        queue_depth=MappingProxyType(
            {sid: s.inbox.buffered if s.inbox else 0 for sid, s in actor.slots.items()}
        ),
        num_steps=c.num_steps,
        last_batch_size=c.last_batch_size,
        max_batch_size=c.max_batch_size_seen,
        mean_batch_size=c.num_batched / c.num_steps if c.num_steps else 0.0,
        num_skipped_no_credit=c.num_skipped_no_credit,
        num_payloads_sent=c.num_payloads_sent,
        num_visible_sent=c.num_visible_sent,
        num_stream_failures=c.num_stream_failures,
        num_step_failures=c.num_step_failures,
        busy_s=c.busy_s,
        idle_s=c.idle_s,
        hung=actor.hung,
        model=MappingProxyType(actor.model_statistics()),
    )


def _stream_statistics(stream: Stream) -> StreamStatistics:
    in_flight = {name: link.buffered for name, link in stream.edges.items()}
    in_flight["client"] = stream.client.buffered
    return StreamStatistics(
        stream_id=stream.id,
        in_flight=MappingProxyType(in_flight),
        held_by=tuple(sorted(stream.holders)),
        num_delivered=stream.num_delivered,
    )


@asynccontextmanager
async def open_pipeline(config: PipelineConfig | str | os.PathLike[str]) -> AsyncIterator[Pipeline]:
    """Start every stage of ``config`` (a ``PipelineConfig`` or a YAML path) and yield the pipeline.

    Blocks until every stage has loaded, in pipeline order; a stage that fails
    to load raises ``StageLoadError`` (after stopping those already started).
    On exit, for any reason, open streams fail with ``PipelineClosed``, actors
    are cancelled and worker threads joined; this returns within
    ``pipeline.shutdown_timeout_s`` even if producers sit on full channels. A
    stage still stuck in a step past that deadline is logged with its streams.
    """
    if not isinstance(config, PipelineConfig):
        config = load_config(config)
    actors = [StageActor(spec, config.source) for spec in config.stages]
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            for actor in actors:
                edge = config.edge_from(actor.name)
                limits = (edge.capacity if edge else None, config.pipeline.client_capacity)
                await nursery.start(actor.run, limits, config.pipeline.shutdown_timeout_s)
            pipeline = Pipeline(config, actors)
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
