"""Shedding: the streams a stage that fell behind fails, the half of ``Admission``
(``_rule.py``) that runs after a round.

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
``StreamShed``; failing a stream drops it at every stage at once. The shedding
threshold is scaled by the same ``A / (A + B)`` as admission's (``_rule.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import StreamShed
from .._stream import StreamState
from ._headroom import StepModel
from ._utilisation import BusyWatch

SHED_MARGINS = 2.0
"""Shedding waits for the factor to fall this many ``realtime_margin``s below 1."""
SHED_AFTER_S = 0.25
"""How long a stage's factor must stay below the shedding threshold before it sheds."""
MIN_BUSY_FRACTION = 0.5
"""A stage busier than this share of the wall time (lately) may shed."""
SHED_HORIZON_S = 2.0
"""A stream with more audio than this beyond its deadline is not projected to miss it."""


class Shedding:
    """``Admission``'s shedding (trio thread only). ``Admission`` sets its attributes and
    gives ``length_factor`` and ``needed_at``, what admission keeps."""

    headroom: bool
    realtime_margin: float
    num_shed: int
    _watches: dict[str, BusyWatch]

    @property
    def length_factor(self) -> float:
        """``A / (A + client_buffer_s)`` (``Admission.length_factor``)."""
        raise NotImplementedError

    def needed_at(self, model: StepModel, num_streams: int, audio_s: float) -> float:
        """The realtime factor admission keeps at ``model``'s stage (``Admission.needed_at``)."""
        raise NotImplementedError

    @property
    def shed_below(self) -> float:
        """The realtime factor under which a stage may shed (hysteresis below admission's)."""
        return (1.0 - SHED_MARGINS * self.realtime_margin) * self.length_factor

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
        watch = self._watch(stage, now_s, busy_s)
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

    def _watch(self, stage: str, now_s: float, busy_s: float) -> BusyWatch:
        """``stage``'s watch, brought up to ``now_s`` (its busy time so far ``busy_s``)."""
        watch = self._watches.get(stage)
        if watch is None:
            watch = self._watches[stage] = BusyWatch(now_s, busy_s)
        watch.update(now_s, busy_s)
        return watch

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
        # as admission would, with the margin the stage keeps: the kept streams catch up
        keep = max(1, model.realtime_streams(audio_s, self.needed_at, num_live))
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
