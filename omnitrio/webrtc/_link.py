"""A WebRTC call as the trio side sees it: a message transport and two audio directions.

``CallLink`` is what the server's Realtime connection drives for a call, in place of a
WebSocket: ``receive`` / ``send`` / ``close`` carry the Realtime events on the
``oai-events`` data channel; ``heard`` gives the caller's microphone at the session's
input rate; ``play`` queues the answer's audio for the outgoing track and waits while
the playout buffer is full (the response's backpressure); ``stop_playing`` cuts it.
Every call into aiortc goes through the ``AsyncioThread`` bridge, one awaited
coroutine at a time.
"""

from __future__ import annotations

import contextlib

import numpy as np
import trio

from .._resample import Floats, StreamResampler
from ._bridge import AsyncioThread
from ._peer import Peer, PeerGone
from ._playout import TRACK_RATE_HZ, Playout


def _to_float(pcm16: bytes) -> Floats:
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / np.float32(32768.0)


def _to_pcm16(samples: Floats) -> bytes:
    scaled = np.clip(samples, -1.0, 1.0 - 1 / 32768) * 32768.0
    return bytes(scaled.astype("<i2").tobytes())


class CallLink:
    """One call's transport and media for the trio side (see the module docstring)."""

    def __init__(
        self,
        bridge: AsyncioThread,
        playout_capacity_s: float,
        input_rate_hz: int,
        media_timeout_s: float,
        input_prefetch_frames: int = 0,
    ) -> None:
        self._bridge = bridge
        self._media_timeout_s = media_timeout_s
        self._token = trio.lowlevel.current_trio_token()
        self._space = trio.Event()
        capacity = max(1, int(playout_capacity_s * TRACK_RATE_HZ))
        self.playout = Playout(capacity, self._wake_from_thread)
        self.peer = Peer(self.playout, input_prefetch_frames)
        self._input_rate_hz = input_rate_hz
        self._in: StreamResampler | None = None
        self._out: dict[str, StreamResampler] = {}  # item id -> its audio's resampler
        self._out_rate_hz = 0

    def _wake_from_thread(self) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._wake, idempotent=True)

    def _wake(self) -> None:
        """The asyncio side took audio (room was made) or the playing stopped: every
        waiter looks again (each holds the event it looked under)."""
        self._space.set()
        self._space = trio.Event()

    # ------------------------------------------------------------ the data channel

    async def receive(self) -> str | bytes:
        return await self._bridge.run(self.peer.next_message)

    async def send(self, data: str | bytes) -> None:
        text = data if isinstance(data, str) else data.decode()
        await self._bridge.run(self.peer.send, [text])

    async def close(self, code: int, reason: str = "") -> None:
        await self._bridge.run(self.peer.close)

    # ------------------------------------------------------------ audio

    async def heard(self) -> bytes:
        """The caller's next 20 ms or so, PCM16 mono at the session's input rate.
        ``PeerGone`` when none came for ``media_timeout_s``: a browser sends its
        microphone's frames even when muted (silence), so a silent track is a peer
        that went away without a word (a closed tab, a lost network)."""
        with trio.move_on_after(self._media_timeout_s):
            pcm16, rate_hz = await self._bridge.run(self.peer.next_audio)
            if self._in is None or self._in.from_hz != rate_hz:
                self._in = StreamResampler(rate_hz, self._input_rate_hz)
            return _to_pcm16(self._in.push(_to_float(pcm16)))
        raise PeerGone(f"no audio from the caller for {self._media_timeout_s:g} s")

    async def play(self, item_id: str, pcm16: bytes, rate_hz: int) -> None:
        """Queue ``item_id``'s audio for the track, waiting while the playout is full."""
        resampler = self._out.get(item_id)
        if resampler is None:
            resampler = self._out[item_id] = StreamResampler(rate_hz, TRACK_RATE_HZ)
        await self._offer(item_id, _to_pcm16(resampler.push(_to_float(pcm16))))

    async def end_item(self, item_id: str) -> None:
        """``item_id``'s audio is all given: what its resampler holds back goes too."""
        resampler = self._out.pop(item_id, None)
        if resampler is not None:
            await self._offer(item_id, _to_pcm16(resampler.flush()))

    async def _offer(self, item_id: str, pcm16: bytes) -> None:
        while pcm16:
            space = self._space
            taken = self.playout.offer(item_id, pcm16)
            pcm16 = pcm16[taken:]
            if pcm16:
                await space.wait()

    def stop_playing(self) -> tuple[str | None, int]:
        """Cut the answer's audio now: the item that was playing and how much of it
        went out (ms); (None, 0) when nothing played."""
        item_id = self.playout.clear()
        self._out.clear()
        return item_id, 0 if item_id is None else self.playout.played_ms(item_id)

    async def wait_played_out(self) -> None:
        """Until nothing waits in the playout and the track has gone silent."""
        while True:
            change = self._space
            if self.playout.idle():
                return
            await change.wait()
