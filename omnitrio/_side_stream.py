"""The side stage's streams: ``SideStream``, the input edge a caller feeds itself (the
turn detector's, outside admission), bounded by count and by bytes. Opened by
``Pipeline.open_side_stream`` (``_pipeline.py``) through ``SideStreams``."""

from __future__ import annotations

import itertools
import logging
from collections import deque

from ._actor import StageActor
from ._items import Request
from ._link import ClientLink, Link
from ._stream import Stream, StreamHooks, StreamState

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


class SideStreams:
    """The side stage's streams of one pipeline: opened outside admission (none is a
    response), each freed on the side stage alone."""

    def __init__(self, actor: StageActor | None, client_capacity: int) -> None:
        self._actor = actor
        self._client_capacity = client_capacity
        self._ids = itertools.count()
        self._streams: dict[str, StreamState] = {}

    def open(self, request: Request, hooks: StreamHooks) -> SideStream:
        """A stream on the side stage; ``LookupError`` if the config has none."""
        side = self._actor
        if side is None:
            raise LookupError("the pipeline has no side stage (the config's side_stage)")
        stream_id = f"{side.name}{next(self._ids)}"
        in_link = Link(f"->{side.name}", SIDE_INPUT_CAPACITY)
        in_link.consumer_wakeup = side.wakeup
        client = ClientLink("client", self._client_capacity)
        stream = StreamState(
            stream_id, request, client, {in_link.name: in_link}, frozenset({side.name}), hooks
        )
        self._streams[stream_id] = stream
        side.add(stream, in_link, None)
        return SideStream(stream, in_link)

    def ended(self, stream_id: str) -> bool:
        """Whether ``stream_id`` is one of these (its end then drops it from the stage)."""
        if stream_id not in self._streams:
            return False
        assert self._actor is not None
        self._actor.drop(stream_id)
        return True

    def released(self, stream_id: str) -> bool:
        """Whether ``stream_id`` was one of these (it is forgotten now)."""
        return self._streams.pop(stream_id, None) is not None

    def streams(self) -> list[StreamState]:
        return list(self._streams.values())
