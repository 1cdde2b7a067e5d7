"""The answer audio waiting to go out on a call's track: bounded, and shared by two loops.

The trio side (the response reading its pipeline stream) ``offer``s PCM16 at the
track's rate; the asyncio side (aiortc's sender, through ``OutgoingAudioTrack``) takes
one 20 ms frame each 20 ms of wall time, silence when nothing waits (audio that comes
to an empty buffer goes at once, ``on_audio``: the clock restarts from it). The buffer holds at
most ``capacity_samples``: a response that runs ahead of real time waits (``offer``
takes what fits and the trio side waits for ``space`` before offering the rest), so its
pipeline stream's credits run out as they would for a WebSocket client that reads
slowly. ``clear`` drops what waits at once (barge-in): the next frame out is silence.

What was played is counted per item (the samples taken for the encoder), so a
barge-in truncates the conversation to the audio the caller actually heard.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

TRACK_RATE_HZ = 48_000
"""WebRTC's Opus clock: the outgoing track's frames are PCM16 mono at this rate."""
FRAME_SAMPLES = 960
"""20 ms at 48 kHz: one Opus frame."""
KEPT_ITEMS = 8
"""Items whose played time is remembered (a truncate names a recent one)."""


@dataclass
class _Segment:
    item_id: str
    pcm16: bytes
    offset: int = 0  # bytes already taken


class Playout:
    """See the module docstring. Thread-safe: every method takes the lock."""

    def __init__(self, capacity_samples: int, on_space: Callable[[], None]) -> None:
        if capacity_samples < FRAME_SAMPLES:
            raise ValueError(f"capacity_samples must be at least {FRAME_SAMPLES}")
        self.capacity_samples = capacity_samples
        self._on_space = on_space  # called (on the taking thread) after a take frees room
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self._queued = 0  # samples waiting
        self._played: OrderedDict[str, int] = OrderedDict()  # item id -> samples played
        self._playing = False  # the last frame taken held audio
        self.on_audio: Callable[[], None] | None = None
        """Called (on the offering thread) when audio comes to an empty buffer: the
        track sends it without waiting for its next frame time."""

    @property
    def queued_samples(self) -> int:
        with self._lock:
            return self._queued

    def offer(self, item_id: str, pcm16: bytes) -> int:
        """Queue what fits of ``pcm16`` for ``item_id``; the bytes taken (even)."""
        with self._lock:
            room = 2 * (self.capacity_samples - self._queued)
            take = min(len(pcm16) - len(pcm16) % 2, max(0, room))
            woken = take > 0 and self._queued == 0
            if take:
                self._segments.append(_Segment(item_id, pcm16[:take]))
                self._queued += take // 2
        if woken and self.on_audio is not None:
            self.on_audio()
        return take

    def take_frame(self) -> tuple[bytes, bool]:
        """The next 20 ms (silence where nothing waits), and whether it held audio."""
        out = bytearray()
        with self._lock:
            while len(out) < 2 * FRAME_SAMPLES and self._segments:
                segment = self._segments[0]
                need = 2 * FRAME_SAMPLES - len(out)
                chunk = segment.pcm16[segment.offset : segment.offset + need]
                out += chunk
                segment.offset += len(chunk)
                self._count(segment.item_id, len(chunk) // 2)
                if segment.offset >= len(segment.pcm16):
                    self._segments.popleft()
            had_audio = bool(out)
            self._queued -= len(out) // 2
            was_playing, self._playing = self._playing, had_audio
        if had_audio or was_playing:  # room was made, or the playing stopped
            self._on_space()
        out += bytes(2 * FRAME_SAMPLES - len(out))
        return bytes(out), had_audio

    def _count(self, item_id: str, samples: int) -> None:
        self._played[item_id] = self._played.get(item_id, 0) + samples
        self._played.move_to_end(item_id)
        while len(self._played) > KEPT_ITEMS:
            self._played.popitem(last=False)

    def clear(self) -> str | None:
        """Drop everything waiting; the item that was playing (None: nothing was)."""
        with self._lock:
            playing = self._segments[0].item_id if self._segments else None
            self._segments.clear()
            self._queued = 0
        self._on_space()
        return playing

    def played_ms(self, item_id: str) -> int:
        """How much of ``item_id``'s audio went out, in whole milliseconds."""
        with self._lock:
            return self._played.get(item_id, 0) * 1000 // TRACK_RATE_HZ

    def starting(self) -> bool:
        """Audio waits and the last frame out was silence: an answer (or its next
        part, after running dry) is about to start."""
        with self._lock:
            return self._queued > 0 and not self._playing

    def idle(self) -> bool:
        """Nothing waits and the last frame out was silence."""
        with self._lock:
            return not self._segments and not self._playing
