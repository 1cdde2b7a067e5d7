"""A real WebRTC caller for the tests: aiortc on asyncio, as an OpenAI WebRTC client.

``Caller`` offers one audio track (a microphone playing PCM16 at real time, then
silence, as a browser's does) and the ``oai-events`` data channel, posts the offer
with the official ``openai`` SDK's ``client.realtime.calls.create`` (only its base URL
points at omnitrio), and records what comes back: the answer's audio from the remote
track (PCM16 mono at 48 kHz) and every event from the data channel. It runs on an
asyncio loop of its own, on a thread: ``run_caller`` from trio tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import itertools
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import openai
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from omnitrio import resample_float
from omnitrio.webrtc._peer import set_prefetch

RATE_HZ = 48_000
FRAME = 960  # 20 ms
SOUND_LEVEL = 16
"""A received frame with a sample above this has sound (Opus decodes silence to ~0)."""


class Microphone(MediaStreamTrack):
    """PCM16 (24 kHz) played at real time, then silence; ``say`` queues more."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending = np.zeros(0, np.int16)
        self._start: float | None = None
        self._pts = 0

    def say(self, pcm16_24k: bytes) -> float:
        """Queue speech; the time (``time.monotonic()``) its first sample goes out."""
        samples = np.frombuffer(pcm16_24k, "<i2").astype(np.float32) / 32768
        up = (np.clip(resample_float(samples, 24_000, RATE_HZ), -1, 1) * 32767).astype(np.int16)
        ahead = self._pending.size
        self._pending = np.concatenate([self._pending, up])
        if self._start is None:
            return time.monotonic() + ahead / RATE_HZ
        return self._start + (self._pts + FRAME + ahead) / RATE_HZ

    @property
    def talking(self) -> bool:
        return self._pending.size > 0

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE_HZ - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        chunk, self._pending = self._pending[:FRAME], self._pending[FRAME:]
        chunk = np.concatenate([chunk, np.zeros(FRAME - chunk.size, np.int16)])
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(chunk.tobytes())
        frame.sample_rate, frame.pts = RATE_HZ, self._pts
        frame.time_base = fractions.Fraction(1, RATE_HZ)
        return frame


class Caller:
    """One WebRTC call to omnitrio (see the module docstring)."""

    def __init__(self, base_url: str, api_key: str = "unused") -> None:
        self.base_url, self.api_key = base_url, api_key
        self.pc = RTCPeerConnection()
        self.mic = Microphone()
        self.events: list[dict[str, Any]] = []
        self.event_times: list[float] = []  # time.monotonic() each event arrived
        self.audio = bytearray()  # the answer, PCM16 mono 48 kHz
        self.audio_times: list[float] = []  # time.monotonic() of each frame with sound
        self.frames: list[tuple[float, int]] = []  # (time.monotonic(), pts) of every frame
        self.call_id: str | None = None
        self._new_event = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", self._on_message)
        self.pc.addTransceiver(self.mic, direction="sendrecv")
        self.pc.on("track", self._on_track)

    def _on_message(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self.event_times.append(time.monotonic())
        self._new_event.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        # aiortc holds received audio 80 ms unless told: as the server does, hear each
        # packet as it arrives (a client that plays what it gets at once, as the
        # benchmark's WebSocket client is counted).
        for transceiver in self.pc.getTransceivers():
            if transceiver.receiver.track is track:
                set_prefetch(transceiver.receiver, 0)
        self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                samples = frame.to_ndarray().reshape(-1, len(frame.layout.channels)).mean(axis=1)
                pcm = samples.astype("<i2")
                self.frames.append((time.monotonic(), frame.pts))
                if np.abs(pcm).max(initial=0) > SOUND_LEVEL:
                    self.audio_times.append(time.monotonic())
                self.audio += pcm.tobytes()
        except MediaStreamError:
            return

    async def connect(self, session: dict[str, Any] | None = None) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        kwargs: dict[str, Any] = {"sdp": self.pc.localDescription.sdp}
        if session is not None:
            kwargs["session"] = session
        async with self._client() as client:
            raw = await client.realtime.calls.with_raw_response.create(**kwargs)
        assert raw.status_code == 201, raw.status_code
        self.call_id = raw.headers["location"].rsplit("/", 1)[-1]
        answer = raw.http_response.text
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    def _client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.api_key, max_retries=0
        )

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> dict[str, Any]:
        """The first event (seen or to come) ``predicate`` accepts."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            self._new_event.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                types = [e["type"] for e in self.events]
                raise TimeoutError(f"no such event in {timeout_s} s; saw {types}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_event.wait(), left)

    async def wait_type(self, name: str, timeout_s: float) -> dict[str, Any]:
        return await self.wait_for(lambda e: e["type"] == name, timeout_s)

    async def next_event(self, index: int, timeout_s: float) -> tuple[dict[str, Any], float]:
        """The ``index``-th event (waiting for it) and when it arrived."""
        async with asyncio.timeout(timeout_s):
            while len(self.events) <= index:
                self._new_event.clear()
                await self._new_event.wait()
        return self.events[index], self.event_times[index]

    def time_of(self, event: dict[str, Any]) -> float:
        return self.event_times[next(i for i, e in enumerate(self.events) if e is event)]

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    async def hang_up(self) -> None:
        assert self.call_id is not None
        async with self._client() as client:
            await client.realtime.calls.hangup(self.call_id)

    async def close(self) -> None:
        self.mic.stop()
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()


def track_gaps(frames: list[tuple[float, int]]) -> tuple[int, float]:
    """A remote track's frames lost (RTP timestamps skipped) and the latest any frame
    came (s) after the soonest it could have by the frames before it: the receive
    buffer a client playing the track needs to play it without a gap. ``frames``:
    (arrival, pts) of each frame, as ``Caller.frames``."""
    lost, latest, soonest = 0, 0.0, math.inf
    for (_, before), (_, pts) in itertools.pairwise(frames):
        lost += max(0, (pts - before) // FRAME - 1)
    for arrived, pts in frames:
        due = arrived - pts / RATE_HZ  # falls when a frame comes sooner than its clock
        soonest = min(soonest, due)
        latest = max(latest, due - soonest)
    return lost, latest


def run_caller(script: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``script`` (an async function using Callers) on a fresh asyncio loop: call
    it with ``trio.to_thread.run_sync(run_caller, script)``."""
    return asyncio.run(script())
