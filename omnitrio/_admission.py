"""Admission by real-time headroom, and shedding when a stage falls behind.

The rule (``docs/design.md``, "Admission"): a new stream is admitted only while,
with it, every stage's learned realtime factor (``_headroom.StepModel``) is at
least ``1 + realtime_margin``; ``max_streams`` stays a hard cap, and the first
stream is always admitted. Once streams are admitted the runtime protects them:
after each round a stage applies, if a stream it planned is past its playback
deadline and its factor for the streams it holds is below
``1 - realtime_margin`` (it slowed down; audio yield learned from completed
streams), the streams beyond what it keeps at ``1 + realtime_margin`` are shed
at once, lowest ``priority`` request option first, then newest first, each
failed with ``StreamShed``; failing a stream drops it at every stage at once.
The retry hint of a refusal is the expected time until a live stream ends: the
mean lifetime of completed streams over the number live.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._errors import Overloaded, StreamShed
from ._headroom import StepModel
from ._items import Request
from ._stream import StreamState

LIFETIME_KEEP = 0.9
"""Weight of the past in the mean lifetime of completed streams (per completion)."""
MIN_RETRY_AFTER_S = 0.05
MAX_RETRY_AFTER_S = 60.0


def priority_of(request: Request) -> float:
    """The request's ``priority`` knob (higher is shed later; default 0)."""
    value = request.options.knobs.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"request option priority must be a number, not {value!r}")
    return float(value)


class Admission:
    """The supervisor's admission and shedding decisions (trio thread only)."""

    def __init__(self, max_streams: int, realtime_margin: float, *, headroom: bool) -> None:
        self.max_streams = max_streams
        self.realtime_margin = realtime_margin
        self.headroom = headroom
        self.num_refused_headroom = 0
        self.num_shed = 0
        self._mean_lifetime_s: float | None = None

    def refusal(
        self, num_live: int, num_open: int, models: Iterable[tuple[str, StepModel]], audio_s: float
    ) -> Overloaded | None:
        """Why one more stream must be refused now, or None to admit it."""
        if num_open >= self.max_streams:
            return Overloaded(self.max_streams, self.retry_after_s(num_live))
        if not self.headroom or num_live == 0:
            return None
        needed = 1.0 + self.realtime_margin
        for name, model in models:
            factor = model.realtime_factor(num_live + 1, audio_s)
            if factor < needed:
                problem = (
                    f"with {num_live + 1} streams stage {name!r} would make {factor:.2f} s of "
                    f"audio per second for each (pipeline.realtime_margin asks for {needed:.2f})"
                )
                return Overloaded(self.max_streams, self.retry_after_s(num_live), problem)
        return None

    def retry_after_s(self, num_live: int) -> float | None:
        """Expected time until one of ``num_live`` streams ends (None: nothing measured)."""
        if self._mean_lifetime_s is None:
            return None
        estimate = self._mean_lifetime_s / max(num_live, 1)
        return min(max(estimate, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)

    def completed(self, lifetime_s: float) -> None:
        mean = self._mean_lifetime_s
        self._mean_lifetime_s = (
            lifetime_s if mean is None else mean * LIFETIME_KEEP + lifetime_s * (1 - LIFETIME_KEEP)
        )

    def behind(self, model: StepModel, num_live: int, audio_s: float) -> bool:
        """The stage keeps fewer than the ``num_live`` streams in real time (cheap)."""
        if not self.headroom or num_live <= 1 or not model.settled:
            return False
        # Admission keeps 1 + margin; shedding waits for 1 - margin: a dip of the
        # model's noise between the two sheds nothing.
        return model.realtime_factor(num_live, audio_s) < 1.0 - self.realtime_margin

    def shed(
        self, stage: str, model: StepModel, live: Sequence[StreamState], audio_s: float
    ) -> None:
        """Fail the streams beyond those ``stage`` keeps in real time: lowest priority
        first, then newest first (``behind`` said it is behind)."""
        num_live = len(live)
        factor = model.realtime_factor(num_live, audio_s)
        needed = 1.0 + self.realtime_margin  # as admission would: the kept streams catch up
        keep = max(1, model.realtime_streams(audio_s, needed, num_live))
        problem = (
            f"stage {stage!r} slowed to {factor:.2f} s of audio per second for each of "
            f"{num_live} streams; it keeps {keep} in real time"
        )
        order = sorted(live, key=lambda s: (-s.priority, s.admitted_at_s))
        for stream in order[keep:]:  # highest priority, then oldest, are kept
            self.num_shed += 1
            stream.fail(StreamShed(stream.id, stage, problem))
