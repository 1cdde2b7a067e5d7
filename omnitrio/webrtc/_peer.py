"""One call's RTCPeerConnection, on the asyncio loop (every method here runs there).

The trio side reaches it only through ``AsyncioThread.run``: it pulls the caller's
audio frame by frame (``next_audio``) and the data channel's messages one by one
(``next_message``), pushes events out with ``send`` (which waits while the channel's
buffer is over ``SEND_BUFFER_BYTES``) and waits for the end (``wait_ended``). The
answer's audio goes out through ``Playout``, which this module's track drains at real
time. The only queue the asyncio side fills on its own is the data channel's inbox,
bounded at ``MAX_INBOX_MESSAGES``: a caller that sends faster than the session reads is
hung up on (``Inbox full``), as a WebSocket client past its frame limits is.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
from collections.abc import Sequence

import aioice.ice
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCSessionDescription,
)
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtpPacket
from av import AudioFrame

from .._trace import mark
from ._playout import FRAME_SAMPLES, TRACK_RATE_HZ, Playout

logger = logging.getLogger(__name__)

EVENTS_LABEL = "oai-events"
"""The data channel OpenAI's WebRTC clients open for the Realtime events."""
MAX_INBOX_MESSAGES = 256
SEND_BUFFER_BYTES = 1 << 20
"""``send`` waits while the data channel holds more than this, unsent."""


def use_host_addresses(addresses: Sequence[str] | None) -> None:
    """Offer ICE host candidates on ``addresses`` only (None: every interface but
    loopback, aioice's own choice). The server listens where its HTTP port does: bound
    to a loopback address, its calls' media stays on loopback too. Process-wide (aioice
    reads a module function); every peer connection of the process is the server's."""
    if addresses is None:
        aioice.ice.get_host_addresses = _every_interface
        return
    chosen = list(addresses)

    def only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = only


_every_interface = aioice.ice.get_host_addresses


_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # RTCRtpReceiver's private __jitter_buffer


class PacketFrames(JitterBuffer):
    """Received audio handed on packet by packet, each as it arrives.

    An Opus RTP packet is one whole frame (RFC 7587, section 4.2), but aiortc's jitter
    buffer knows a frame is complete only once a packet of the next one is in, and then
    holds it until ``prefetch`` more have come (4: a fixed 80 ms; at least one frame,
    20 ms, whatever it is told). This hands each packet to the decoder at once; a packet
    older than one already handed on (late, reordered or repeated) is dropped: the VAD
    and ASR hear a 20 ms gap, which a loopback or LAN never makes."""

    def __init__(self) -> None:
        super().__init__(capacity=16)
        self._last: int | None = None  # the sequence number last handed on

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        number = packet.sequence_number
        if self._last is not None and not 0 < (number - self._last) % 0x10000 < 0x8000:
            return False, None
        self._last = number
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)  # type: ignore[attr-defined]


def set_prefetch(receiver: RTCRtpReceiver, frames: int) -> None:
    """Make ``receiver`` hand its audio on each packet as it arrives (``frames`` 0:
    ``PacketFrames``), or each frame once ``frames`` later ones have arrived (aiortc's
    own buffer, told its prefetch). Left as it is where aiortc's layout differs."""
    buffer = getattr(receiver, _JITTER_BUFFER, None)
    if not isinstance(buffer, JitterBuffer):
        logger.warning("aiortc's receiver has no jitter buffer where expected; left as it is")
    elif frames == 0:
        setattr(receiver, _JITTER_BUFFER, PacketFrames())
    else:
        setattr(receiver, _JITTER_BUFFER, JitterBuffer(buffer.capacity, prefetch=frames))


class PeerGone(Exception):
    """The call ended: the peer closed, the connection failed, or the server hung up."""


class OutgoingAudioTrack(MediaStreamTrack):
    """The answer's audio: one 20 ms frame each 20 ms, from ``Playout``.

    Audio that comes to an empty playout is sent at once, not at the next frame time
    (which would add 0-20 ms, 10 on average, to every answer's start): the frame clock
    restarts from it. Its RTP timestamp follows the last one's by a frame as always, so
    the caller's jitter buffer sees one packet up to 20 ms early."""

    kind = "audio"

    def __init__(self, playout: Playout) -> None:
        super().__init__()
        self._playout = playout
        self._start: float | None = None
        self._pts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick: asyncio.Future[None] | None = None
        self._playing = False
        playout.on_audio = self._audio_came

    def _audio_came(self) -> None:
        """(On the offering thread.) Wake a wait for the next frame time."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the call is over
                loop.call_soon_threadsafe(self._wake)

    def _wake(self, due: bool = False) -> None:
        """The frame time came (``due``), or audio came to a silent track."""
        tick = self._tick
        if tick is not None and not tick.done() and (due or self._playout.starting()):
            tick.set_result(None)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = self._loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:  # the frame is due on the RTP clock: a timer, not a poll
            self._pts += FRAME_SAMPLES
            due = self._start + self._pts / TRACK_RATE_HZ
            if due > loop.time():
                tick = self._tick = loop.create_future()
                timer = loop.call_at(due, self._wake, True)
                self._wake()  # audio that came before this wait began
                try:
                    await tick
                finally:
                    timer.cancel()
                    self._tick = None
                self._start -= max(0.0, due - loop.time())  # sent early: the clock restarts
        pcm16, had_audio = self._playout.take_frame()
        if had_audio and not self._playing:
            mark("track_first_frame", "-")  # the latency benchmark's --trace
        self._playing = had_audio
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm16)
        frame.sample_rate = TRACK_RATE_HZ
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, TRACK_RATE_HZ)
        return frame


def mono_pcm16(frame: AudioFrame) -> tuple[bytes, int]:
    """A received frame as mono PCM16 (channels averaged) and its rate."""
    samples = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        data = samples.astype(np.float32)
    else:
        data = samples.reshape(-1, channels).T.astype(np.float32)
    if frame.format.name not in ("s16", "s16p"):
        raise ValueError(f"received audio in {frame.format.name}, not s16")
    mono = data.mean(axis=0)
    return np.clip(mono, -32768, 32767).astype("<i2").tobytes(), frame.sample_rate


class Peer:
    """One call's peer connection (see the module docstring)."""

    def __init__(self, playout: Playout, input_prefetch_frames: int = 0) -> None:
        self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: host only
        self._input_prefetch_frames = input_prefetch_frames
        self._track = OutgoingAudioTrack(playout)
        self._remote_audio: MediaStreamTrack | None = None
        self._audio_arrived = asyncio.Event()
        self._channel: RTCDataChannel | None = None
        self._channel_open = asyncio.Event()
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue(MAX_INBOX_MESSAGES)
        self._ended = asyncio.Event()
        self.why_ended = ""
        self.connected = asyncio.Event()
        self._pc.on("track", self._on_track)
        self._pc.on("datachannel", self._on_datachannel)
        self._pc.on("connectionstatechange", self._on_state)

    async def answer(self, offer_sdp: str) -> str:
        """Take the caller's offer; the answer (with this side's ICE candidates)."""
        await self._pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        if not any(t.kind == "audio" for t in self._pc.getTransceivers()):
            raise ValueError("the offer has no audio m-line")
        self._pc.addTrack(self._track)
        await self._pc.setLocalDescription(await self._pc.createAnswer())
        return str(self._pc.localDescription.sdp)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._remote_audio is None:
            self._remote_audio = track
            self._audio_arrived.set()
            for transceiver in self._pc.getTransceivers():
                if transceiver.receiver.track is track:
                    set_prefetch(transceiver.receiver, self._input_prefetch_frames)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_LABEL or self._channel is not None:
            logger.info("ignored a data channel labelled %r", channel.label[:64])
            return
        self._channel = channel
        channel.bufferedAmountLowThreshold = SEND_BUFFER_BYTES // 2
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._end("the caller closed the data channel"))
        self._channel_open.set()

    def _on_message(self, message: str | bytes) -> None:
        try:
            self._inbox.put_nowait(message)
        except asyncio.QueueFull:
            self._end(f"the caller sent over {MAX_INBOX_MESSAGES} events the server had not read")

    def _on_state(self) -> None:
        state = self._pc.connectionState
        if state == "connected":
            self.connected.set()
        elif state in ("failed", "closed"):
            self._end(f"the connection {state}")

    def _end(self, why: str) -> None:
        if not self._ended.is_set():
            self.why_ended = why
            self._ended.set()

    async def wait_connected(self, has_channel: bool) -> None:
        """Until the connection is up (and the events channel open, when offered)."""
        await self.connected.wait()
        if has_channel:
            await self._channel_open.wait()

    async def wait_ended(self) -> str:
        await self._ended.wait()
        return self.why_ended

    async def next_audio(self) -> tuple[bytes, int]:
        """The caller's next audio frame as mono PCM16, and its rate."""
        await self._audio_arrived.wait()
        assert self._remote_audio is not None
        try:
            frame = await self._remote_audio.recv()
        except MediaStreamError:
            self._end("the caller's audio track ended")
            raise PeerGone(self.why_ended) from None
        if not isinstance(frame, AudioFrame):
            raise PeerGone("the caller's audio track sent a video frame")
        return mono_pcm16(frame)

    async def next_message(self) -> str | bytes:
        """The data channel's next message (``PeerGone`` once the call ended)."""
        get = asyncio.ensure_future(self._inbox.get())
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait((get, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not get.done():
                get.cancel()
        if get.done() and not get.cancelled():
            return get.result()
        raise PeerGone(self.why_ended)

    async def send(self, messages: Sequence[str]) -> None:
        """Send on the data channel, waiting while its buffer is full."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return  # no channel (an audio-only call), or it is closing: nobody reads
        for message in messages:
            channel.send(message)
        if channel.bufferedAmount > SEND_BUFFER_BYTES:
            drained = asyncio.Event()
            channel.once("bufferedamountlow", drained.set)
            ended = asyncio.ensure_future(self._ended.wait())
            try:
                await asyncio.wait(
                    (asyncio.ensure_future(drained.wait()), ended),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                ended.cancel()

    async def close(self, flush_s: float = 0.0) -> None:
        """Hang up. With ``flush_s``, where the call is still up, the events channel is
        closed the orderly way first (aiortc sends what it holds before the stream reset)
        and the caller is given at most that long to close its end, so the last events
        reach it; then the connection closes (which would drop what is unsent)."""
        channel = self._channel
        flush = flush_s > 0 and not self._ended.is_set()
        self._end("the server hung up")
        if flush and channel is not None and channel.readyState == "open":
            closed = asyncio.Event()
            channel.once("close", closed.set)
            channel.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), flush_s)
        self._track.stop()
        await self._pc.close()
