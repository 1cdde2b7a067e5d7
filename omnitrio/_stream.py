"""A stream: one request's journey through every stage, and its client-side handle.

As trio splits a channel's shared state from its endpoints, a stream is two
objects. ``StreamState`` is the runtime's: the stream's links (one per edge and
the client link), which stages still hold it, failing and releasing it.
``Stream`` is the client's handle: the id, receiving (``async for``), ``aclose()``
and the failure, and nothing else.

The client reads user-visible items from the stream's *client link*, a bounded
channel every stage writes to directly, so an item is readable the moment the
step that made it returns — it never waits behind other streams or behind edge
payloads (seed 001). When the last stage finishes the stream the link reaches
end-of-channel and iteration stops. A failed stream ends the same way, and the
iterator then raises the stage's ``StageError`` after the items made before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Self

import trio

from ._errors import OmnitrioError
from ._items import VISIBLE_TYPES, Request, VisibleItem
from ._link import ClientLink, Link
from ._scheduler import Playback
from ._statistics import StreamStatistics

logger = logging.getLogger(__name__)


@dataclass
class DeliveryCounters:
    """Pipeline-wide client-side counts, shared by every stream of a pipeline."""

    num_delivered: int = 0
    num_non_visible_seen: int = 0
    audio_s_put: float = 0.0
    """Seconds of audio the stages put on clients' links (what the step-time models'
    audio per stream-step is learned from)."""


@dataclass(frozen=True)
class StreamHooks:
    """What a stream tells its pipeline: it ended (every actor drops it), it was released."""

    on_end: Callable[[StreamState], None]
    on_released: Callable[[StreamState], None]
    counters: DeliveryCounters
    release_timeout_s: float
    playback: Playback = field(default_factory=Playback)


class StreamState:
    """The runtime's side of one stream. Made by the supervisor when it admits one."""

    def __init__(
        self,
        stream_id: str,
        request: Request,
        client: ClientLink,
        edges: Mapping[str, Link],
        holders: frozenset[str],
        hooks: StreamHooks,
    ) -> None:
        self.id = stream_id
        self.request = request
        self.client = client
        self.edges = MappingProxyType(dict(edges))
        self._holders = set(holders)
        self.hooks = hooks
        self.released = trio.Event()
        self.failure: OmnitrioError | None = None
        self.cancelled = False
        self.num_delivered = 0
        self.admitted_at_s = time.perf_counter()
        self.priority = 0.0
        self.num_steps_at: dict[str, int] = {}
        """Per stage that released it: the steps it took there."""
        """The request's ``priority`` option: streams are shed lowest first."""
        self.first_audio_at_s: float | None = None
        self.audio_s = 0.0
        """Seconds of audio put on the client link so far."""
        self.first_chunk_s = 0.0
        """Seconds of audio in its first chunk (made before its client plays)."""
        self.lag_s = 0.0
        """At its latest audio chunk: how long a player that started at its first chunk
        had waited for it (0 when it came in time; admission's lateness guard)."""
        self.deadline_s = hooks.playback.deadline_s(self.admitted_at_s, None, 0.0)
        """When its client runs out of audio, less the client buffer (``Playback``)."""

    def put_audio(self, duration_s: float, now_s: float) -> None:
        """``duration_s`` of audio went onto the client link at ``now_s`` (perf_counter)."""
        if self.first_audio_at_s is None:
            self.first_audio_at_s, self.first_chunk_s = now_s, duration_s
        self.lag_s = max(0.0, now_s - self.first_audio_at_s - self.audio_s)
        self.audio_s += duration_s
        self.hooks.counters.audio_s_put += duration_s
        self.deadline_s = self.hooks.playback.deadline_s(
            self.admitted_at_s, self.first_audio_at_s, self.audio_s
        )

    @property
    def ending(self) -> bool:
        """Failed or cancelled: every stage drops it at its next step boundary."""
        return self.failure is not None or self.cancelled

    @property
    def holders(self) -> frozenset[str]:
        """Stages that still hold state for this stream."""
        return frozenset(self._holders)

    @trio.lowlevel.enable_ki_protection
    def fail(self, error: OmnitrioError) -> None:
        """Fail the stream (first error wins). Items already delivered stay readable."""
        if self.ending:
            return
        self.failure = error
        for link in self.edges.values():
            link.discard()
        self.client.close_send()
        self.hooks.on_end(self)

    @trio.lowlevel.enable_ki_protection
    def cancel(self) -> None:
        """The client let go: discard every link and have every stage drop it. A stream
        every stage has finished (its client link at its end) is not cancelled: the
        stages are releasing it already."""
        if self.ending or self.released.is_set() or self.client.producers_done:
            if not self.client.discarded:
                self.client.discard()  # completed or failed: later receives raise Closed
            return
        self.cancelled = True
        for link in (*self.edges.values(), self.client):
            link.discard()
        self.hooks.on_end(self)

    @trio.lowlevel.enable_ki_protection
    def released_by(self, stage: str) -> None:
        """``stage`` freed its state for this stream."""
        self._holders.discard(stage)
        if not self._holders and not self.released.is_set():
            self.released.set()
            self.hooks.on_released(self)

    def statistics(self) -> StreamStatistics:
        in_flight = {name: link.buffered for name, link in self.edges.items()}
        in_flight["client"] = self.client.buffered
        return StreamStatistics(
            stream_id=self.id,
            in_flight=MappingProxyType(in_flight),
            held_by=tuple(sorted(self._holders)),
            num_delivered=self.num_delivered,
        )


class Stream:
    """Client handle of one stream. Made only by ``Pipeline.open_stream``.

    Iterate it (``async for item in stream``) to receive ``TextDelta``,
    ``AudioChunk`` and ``Event`` items in the order each stage produced them.
    """

    __slots__ = ("_state", "id")

    def __init__(self, state: StreamState) -> None:
        self.id = state.id
        self._state = state

    @property
    def failure(self) -> OmnitrioError | None:
        """The error the stream failed with (``StageError``, ``PipelineClosed``), or None."""
        return self._state.failure

    @trio.lowlevel.enable_ki_protection
    async def receive(self) -> VisibleItem:
        """Wait for the next user-visible item.

        Blocks until a stage produces one. Raises ``StopAsyncIteration`` when the
        stream is complete, the stage's ``StageError`` if it failed, and
        ``trio.ClosedResourceError`` after ``aclose()``. Cancellation-safe: a
        cancelled call consumes no item. Taking an item frees one unit of credit. One
        task receives at a time: a second one that would wait meanwhile raises
        ``trio.BusyResourceError``.
        """
        state = self._state
        client = state.client
        if client.discarded:
            raise trio.ClosedResourceError(f"stream {self.id!r} is closed")
        try:
            item = await client.receive()
        except trio.EndOfChannel:
            if state.failure is not None:
                raise state.failure from state.failure.__cause__
            raise StopAsyncIteration from None
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError(f"stream {self.id!r} is closed") from None
        client.took(1)
        counters = state.hooks.counters
        if not isinstance(item, VISIBLE_TYPES):
            # Stages are checked before anything reaches this link; this is the last guard.
            counters.num_non_visible_seen += 1
            raise TypeError(f"stream {self.id!r} got a non-visible {type(item).__name__}")
        state.num_delivered += 1
        counters.num_delivered += 1
        return item  # type: ignore[return-value]  # narrowed by VISIBLE_TYPES above

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> VisibleItem:
        return await self.receive()

    async def aclose(self) -> None:
        """Cancel the stream if it is still running and wait until every stage freed it.

        Each stage drops the stream at its next step boundary, so this waits at
        most for the steps in progress plus one more per stage, and never longer
        than the pipeline's ``shutdown_timeout_s`` (a stage stuck in a step is
        then logged with the stream; the stream keeps its admission slot until
        the stage lets go). If this call is cancelled the stages still free the
        stream; only the waiting stops. Idempotent.
        """
        state = self._state
        state.cancel()
        timeout_s = state.hooks.release_timeout_s
        with trio.move_on_after(timeout_s) as waited:
            await state.released.wait()
        if waited.cancelled_caught:
            logger.error(
                "stream %r is still held by stage(s) %s %.1f s after it closed; "
                "a step is not returning",
                self.id,
                ", ".join(sorted(state.holders)),
                timeout_s,
                extra={"stream": self.id},
            )
