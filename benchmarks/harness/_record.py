"""What the load generator writes down about one request: arrival times, nothing derived.

All times are seconds from the moment the request was sent (``sent_at_s`` is
relative to the start of the run), taken on the client with
``time.perf_counter``. Metrics are computed from these records by the pure
functions in ``_metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AudioArrival:
    """One audio chunk as the client received it."""

    at_s: float  # since the request was sent
    duration_s: float  # seconds of audio in the chunk


@dataclass(frozen=True)
class RequestRecord:
    """One request's timeline.

    ``outcome`` is ``"completed"``, ``"failed"`` (an error mid-stream or at
    start, ``error`` says which) or ``"refused"`` (the target said it is full).
    Times count from the first attempt, so a refused-then-retried request's
    wait is in its TTFA (``admitted_at_s`` says how much of it), unless the run
    does not retry: then it is ``"refused"`` at once and ``refused_after_s``
    says how soon. ``wave`` is the rank of its send time divided by the maximum
    concurrency: with more prompts than concurrency, wave 0 runs first and later
    waves follow as slots free up (seed 001).
    """

    index: int
    wave: int
    sent_at_s: float
    outcome: str
    text_at_s: tuple[float, ...] = ()
    audio: tuple[AudioArrival, ...] = ()
    done_at_s: float | None = None
    error: str | None = None
    num_input_words: int = 0
    num_refusals: int = 0  # times the target said it was full before admitting it
    refused_after_s: float | None = None  # send to the first refusal
    admitted_at_s: float = 0.0  # send to the start of the attempt admitted (after refusals)
    warmup: bool = False

    @property
    def num_text_deltas(self) -> int:
        return len(self.text_at_s)

    @property
    def audio_s(self) -> float:
        return sum(chunk.duration_s for chunk in self.audio)
