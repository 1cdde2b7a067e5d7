"""Fair shares: what one client may hold of the server, so that no client holds it all.

A client is its connection's address (the peer's IP). The server has one API key,
shared by every client that has it, so the key cannot tell clients apart; the
address can (behind a proxy, every client is the proxy's: give each its own server
or raise the limits).

Two things are shared:

- **streams** (``ServerSettings.max_streams_per_client``, default half the pipeline's
  ``max_streams``): the pipeline streams a client has open, HTTP responses and Realtime
  responses alike. One more is refused at once (HTTP 429, Realtime ``response.done``
  failed), naming the setting; the pipeline's own ``max_streams`` stays the bound for
  everyone together (503).
- **queued work** (``max_queued_per_client``): requests a client has waiting for, or
  in, the threads that check them off the event loop (parsing a body, compiling its
  tools' schemas, decoding its audio). Past it: 429 naming the setting. The threads are
  ``max_checking_threads`` at most, taken in arrival order, and one client runs on half
  of them at most, so the others always find threads that no one client holds. Audio
  is decoded in as many worker processes instead (``_decoders.py``), which a timeout or
  a cancellation kills, so no upload holds a thread or the server's shutdown.

``/metrics`` reports the limits, the most any client holds, and the refusals by reason
(``client_streams``, ``client_queued``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TypeVar

import trio

from .._errors import OmnitrioError
from ._audio_gate import DecodeLimits
from ._decoders import DecoderPool

DECODE_TIMEOUT_S = 20.0
"""How long one upload may take to decode by default (its worker process is killed past
it): ``ServerSettings.decode_timeout_s``."""

T = TypeVar("T")


def client_of(remote_addr: str | None) -> str:
    """The client a connection belongs to: its peer's address (the port left out)."""
    return remote_addr or "unknown"


class ShareExceeded(OmnitrioError):
    """A client asked for more than its share; ``setting`` names the limit.

    ``retry_after_s`` is the hint it is answered with (HTTP ``Retry-After``, Realtime
    ``retry_after_ms``): one of the client's own streams or checks must end first,
    which the server cannot foresee, so it is the same default as a full pipeline
    without an estimate of its own."""

    retry_after_s = 1.0

    def __init__(self, setting: str, limit: int, what: str) -> None:
        self.setting = setting
        self.limit = limit
        super().__init__(
            f"this client already has {limit} {what}, its share of the server "
            f"({setting}={limit}); wait for one to finish"
        )


class ClientShares:
    """Per-client counts of open streams and queued checks, with their limits."""

    def __init__(
        self,
        max_streams: int,
        max_queued: int,
        max_threads: int,
        decode_timeout_s: float = DECODE_TIMEOUT_S,
    ) -> None:
        self.max_streams = max_streams
        self.max_queued = max_queued
        self.streams: Counter[str] = Counter()
        self.queued: Counter[str] = Counter()
        self.threads = trio.CapacityLimiter(max_threads)
        self._lots: dict[str, trio.lowlevel.ParkingLot] = {}  # clients waiting to queue
        self._running: dict[str, trio.CapacityLimiter] = {}  # each client's share of threads
        self._threads_per_client = max(1, max_threads // 2)
        self.decoders = DecoderPool(max_threads, decode_timeout_s)

    async def __aenter__(self) -> ClientShares:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.decoders.aclose()  # the idle ones: a busy one is killed by its cancel

    def check_stream(self, client: str) -> None:
        """Raise ``ShareExceeded`` if ``client`` cannot open one more stream now."""
        if self.streams[client] >= self.max_streams:
            raise ShareExceeded("max_streams_per_client", self.max_streams, "streams open")

    @contextmanager
    def stream(self, client: str) -> Iterator[None]:
        """Hold one of ``client``'s stream slots while the block runs."""
        self.check_stream(client)
        self.streams[client] += 1
        try:
            yield
        finally:
            self._drop(self.streams, client)

    async def off_loop(self, client: str, work: Callable[[], T], *, wait: bool = False) -> T:
        """``work()`` on a checking thread, counted as one of ``client``'s queued checks.

        Past ``max_queued``: ``ShareExceeded``, or with ``wait`` (a WebSocket, which
        can simply stop reading) wait until one of the client's checks is done."""
        async with self._queued(client, wait):
            return await trio.to_thread.run_sync(work, limiter=self.threads)

    async def decode(self, client: str, data: bytes, demuxer: str, limits: DecodeLimits) -> bytes:
        """``data`` decoded in one of the decoder processes (``_decoders.py``), counted
        as one of ``client``'s queued checks (``ShareExceeded`` past ``max_queued``).
        Cancellable: cancelling it kills the decode."""
        async with self._queued(client, wait=False):
            return await self.decoders.decode(data, demuxer, limits)

    @asynccontextmanager
    async def _queued(self, client: str, wait: bool) -> AsyncIterator[None]:
        while self.queued[client] >= self.max_queued:
            if not wait:
                raise ShareExceeded(
                    "max_queued_per_client", self.max_queued, "requests being checked"
                )
            lot = self._lots.setdefault(client, trio.lowlevel.ParkingLot())
            try:
                await lot.park()
            finally:
                if not lot:
                    self._lots.pop(client, None)
        self.queued[client] += 1
        own = self._running.get(client)
        if own is None:
            own = self._running[client] = trio.CapacityLimiter(self._threads_per_client)
        try:
            async with own:  # one client runs on at most half the threads (and decoders)
                yield
        finally:
            self._drop(self.queued, client)
            if client not in self.queued:
                self._running.pop(client, None)
            waiting = self._lots.get(client)
            if waiting is not None:
                waiting.unpark()

    @staticmethod
    def _drop(counts: Counter[str], client: str) -> None:
        counts[client] -= 1
        if counts[client] <= 0:
            del counts[client]  # the counters hold only clients with something open
