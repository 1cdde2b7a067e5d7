"""What the load generator drives: a ``Target`` takes one request and reports what arrives.

Every target — the in-process pipeline, a server over WebSocket or SSE, each
baseline — implements the same two calls, so the load loop, the clock and the
metrics are shared and only the transport differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import trio

from omnitrio import Request, Scalar

from ._record import AudioArrival


class Refused(Exception):
    """The target is full (``Overloaded``, HTTP 503, close 1013); the client may retry,
    after ``retry_after_s`` where the target said when (None: it did not)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TargetError(Exception):
    """The request failed at the target; the message says how."""


@dataclass(frozen=True)
class Prompt:
    index: int
    text: str
    output_len: int  # text units (tokens) to generate
    options: tuple[tuple[str, Scalar], ...] = ()  # more request options (``--option``)

    @property
    def num_words(self) -> int:
        return len(self.text.split())

    def request(self) -> Request:
        """The pipeline request: the length as ``steps`` (synthetic stages) and
        ``max_tokens`` (model stages and the server's name for it), then ``options``."""
        limits: dict[str, Scalar] = {"steps": self.output_len, "max_tokens": self.output_len}
        return Request(self.text, options=limits | dict(self.options))


@dataclass(frozen=True)
class Sample:
    """Target-side state sampled while the load runs (what the target can tell)."""

    at_s: float  # since the start of the run
    open_streams: int | None
    queue_depth: dict[str, int]  # per stage: items waiting (edges, or a baseline's queues)
    batch_size: dict[str, float]  # per stage: streams in its latest step
    rss_bytes: int | None
    # per stage: the longest synchronous call handling one step's outputs since the
    # last sample (a baseline's orchestrator: what blocks its loop; seed 000's
    # "process_outputs stalls"), ms
    stall_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Timeline:
    """Arrivals of one request, stamped with ``time.perf_counter`` as they come in."""

    sent_s: float = field(default_factory=time.perf_counter)
    read_speed: float | None = None  # a client playing audio at this x real time
    text_at_s: list[float] = field(default_factory=list)
    audio: list[AudioArrival] = field(default_factory=list)

    def restart(self) -> None:
        """Count from now: for transports whose set-up is not part of the request."""
        self.sent_s = time.perf_counter()

    def text(self) -> None:
        self.text_at_s.append(time.perf_counter() - self.sent_s)

    def audio_chunk(self, duration_s: float) -> None:
        if duration_s > 0:
            self.audio.append(AudioArrival(time.perf_counter() - self.sent_s, duration_s))

    async def consume(self, duration_s: float) -> None:
        """A slow reader: take ``duration_s / read_speed`` before reading on (no-op if unset)."""
        if self.read_speed is not None and duration_s > 0:
            await trio.sleep(duration_s / self.read_speed)


class Target(Protocol):
    """One system under test, open for the whole run."""

    name: str

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        """Send ``prompt`` and record every text delta and audio chunk until the end.

        Raises ``Refused`` when the target is full and ``TargetError`` when the
        request fails. Cancelling it abandons the request (the target cleans up).
        """
        ...

    async def sample(self) -> Sample | None:
        """Queue depths, batch sizes and memory now, or None if the target cannot say."""
        ...


def rss_bytes_of_self() -> int | None:
    """Resident memory of this process (Linux), for in-process targets."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
