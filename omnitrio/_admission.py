"""Admission by real-time headroom, and shedding when a stage falls behind.

The rule (``docs/design.md``, "Admission"): a new stream is admitted only while,
with it, every stage's learned realtime factor (``_headroom.StepModel``) for its
*active* streams plus the new one is at least ``1 + realtime_margin``;
``max_streams`` stays a hard cap, and the first stream is always admitted. A
stream is active at a stage while it has work there or had some within the last
``ACTIVE_WINDOW_S`` (or was added there that recently): a stream the stage holds
idle (a voice chat's TTS between answers) costs it no step per round, so it is
not charged one.

Once streams are admitted the runtime protects them, but only from a real,
sustained slowdown, never from the model's noise (a few slow steps dip the fast
``scale`` for a fraction of a second). A stage
sheds after a round it applies only when all of these hold (``should_shed``):

- **hysteresis**: its factor for its active streams is below
  ``1 - SHED_MARGINS * realtime_margin`` (0.9 with the default margin), clearly
  below the ``1 + realtime_margin`` admission keeps, and its audio yield is
  learned from completed streams;
- **persistence**: it has stayed below that on every round for ``SHED_AFTER_S``;
- **saturation**: the stage was busy at least ``MIN_BUSY_FRACTION`` of the wall
  time lately (an idle stage is not what makes streams late);
- **lateness**: a stream it planned in that round was past its playback deadline.

Then the active streams beyond what it keeps at ``1 + realtime_margin`` are shed
at once, lowest ``priority`` request option first, then newest first; a stream
whose client holds more than ``SHED_HORIZON_S`` of audio beyond its buffer is not
projected to miss its deadline and is kept before any other. Each fails with
``StreamShed``; failing a stream drops it at every stage at once. The retry hint of
a refusal is the expected time until a live stream ends: the mean lifetime of
completed streams over the number live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ._errors import Overloaded, StreamShed
from ._headroom import StepModel
from ._items import Request
from ._stream import StreamState

LIFETIME_KEEP = 0.9
"""Weight of the past in the mean lifetime of completed streams (per completion)."""
MIN_RETRY_AFTER_S = 0.05
MAX_RETRY_AFTER_S = 60.0
ACTIVE_WINDOW_S = 0.5
"""A stream with no work at a stage for this long is idle there (not charged a step)."""
SHED_MARGINS = 2.0
"""Shedding waits for the factor to fall this many ``realtime_margin``s below 1."""
SHED_AFTER_S = 0.25
"""How long a stage's factor must stay below the shedding threshold before it sheds."""
MIN_BUSY_FRACTION = 0.5
"""A stage busier than this share of the wall time (lately) may shed."""
BUSY_HALF_LIFE_S = 1.0
"""Half-life of the past in a stage's busy fraction."""
SHED_HORIZON_S = 2.0
"""A stream with more audio than this beyond its deadline is not projected to miss it."""


@dataclass(slots=True)
class _Watch:
    """One stage's shedding state, updated after each round it applies."""

    at_s: float
    busy_s: float
    busy_fraction: float = 0.0
    below_since_s: float | None = None


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
        self._watches: dict[str, _Watch] = {}

    @property
    def shed_below(self) -> float:
        """The realtime factor under which a stage may shed (hysteresis below admission's)."""
        return 1.0 - SHED_MARGINS * self.realtime_margin

    def refusal(
        self,
        num_live: int,
        num_open: int,
        models: Iterable[tuple[str, StepModel]],
        audio_s: float,
        num_active: Mapping[str, int] | Callable[[str], int] | None = None,
    ) -> Overloaded | None:
        """Why one more stream must be refused now, or None to admit it. ``num_active``:
        each stage's active streams, by name (default: all ``num_live`` at every stage);
        asked only of a stage that would refuse with all of them charged."""
        if num_open >= self.max_streams:
            return Overloaded(self.max_streams, self.retry_after_s(num_live))
        if not self.headroom or num_live == 0:
            return None
        needed = 1.0 + self.realtime_margin
        for name, model in models:
            count = num_live + 1
            factor = model.realtime_factor(count, audio_s)
            if factor < needed and num_active is not None:  # fewer may be active there
                active = num_active(name) if callable(num_active) else num_active.get(name)
                count = 1 + min(num_live, num_live if active is None else active)
                factor = model.realtime_factor(count, audio_s)
            if factor < needed:
                problem = (
                    f"with {count} active streams stage {name!r} would make {factor:.2f} s of "
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

    def behind(self, model: StepModel, num_active: int, audio_s: float) -> bool:
        """The stage's factor for ``num_active`` streams is below ``shed_below`` now
        (its yield learned from completed streams). Instantaneous: ``should_shed``
        asks for it to persist."""
        if not self.headroom or num_active <= 1 or not model.settled:
            return False
        return model.realtime_factor(num_active, audio_s) < self.shed_below

    def should_shed(
        self,
        stage: str,
        model: StepModel,
        num_active: int,
        audio_s: float,
        *,
        now_s: float,
        busy_s: float,
        num_late: int,
    ) -> bool:
        """After a round ``stage`` applied at ``now_s`` (``busy_s``: its stage's busy time
        so far; ``num_late``: streams it planned past their deadlines): shed now? Updates
        the stage's watch, so call it after every round."""
        watch = self._watches.get(stage)
        if watch is None:
            watch = self._watches[stage] = _Watch(now_s, busy_s)
        elapsed_s = now_s - watch.at_s
        if elapsed_s > 0:
            recent = min(1.0, max(0.0, (busy_s - watch.busy_s) / elapsed_s))
            keep = 0.5 ** (elapsed_s / BUSY_HALF_LIFE_S)
            watch.busy_fraction = watch.busy_fraction * keep + recent * (1 - keep)
            watch.at_s, watch.busy_s = now_s, busy_s
        if not self.behind(model, num_active, audio_s):
            watch.below_since_s = None
            return False
        if watch.below_since_s is None:
            watch.below_since_s = now_s
        if (
            now_s - watch.below_since_s < SHED_AFTER_S
            or watch.busy_fraction < MIN_BUSY_FRACTION
            or not num_late
        ):
            return False
        watch.below_since_s = None  # the next shed waits as long again
        return True

    def shed(
        self,
        stage: str,
        model: StepModel,
        live: Sequence[StreamState],
        audio_s: float,
        now_s: float | None = None,
    ) -> None:
        """Fail the ``live`` (active) streams beyond those ``stage`` keeps in real time:
        lowest priority first, then newest first; with ``now_s``, a stream more than
        ``SHED_HORIZON_S`` ahead of its deadline is kept first (it will not miss it)."""
        num_live = len(live)
        factor = model.realtime_factor(num_live, audio_s)
        needed = 1.0 + self.realtime_margin  # as admission would: the kept streams catch up
        keep = max(1, model.realtime_streams(audio_s, needed, num_live))
        problem = (
            f"stage {stage!r} slowed to {factor:.2f} s of audio per second for each of "
            f"{num_live} streams; it keeps {keep} in real time"
        )
        horizon_s = None if now_s is None else now_s + SHED_HORIZON_S

        def order(stream: StreamState) -> tuple[bool, float, float]:
            safe = horizon_s is not None and stream.deadline_s > horizon_s
            return (not safe, -stream.priority, stream.admitted_at_s)

        for stream in sorted(live, key=order)[keep:]:  # safe, highest priority, oldest kept
            self.num_shed += 1
            stream.fail(StreamShed(stream.id, stage, problem))
