"""How streams arrive at a stage: one at a time (staggered) or together (in lockstep),
and what that changes in a round's cost (``StepModel.round_s``, ``_headroom.py``).

A *cohort* is the streams whose first steps at a stage fall in one step: a closed
loop's completions send streams back together, an open loop's arrive alone or a few to
a step. ``Cohorts.size`` is the cohort a stream arrives in, on average over the recent
streams (each stream weighs one): 1 where every stream arrives alone, up to a whole
batch in lockstep. (Counting a run of consecutive steps that each take a first step as
one cohort was tried: under dense open-loop arrivals the runs never end, the share was
not charged, and `bench-omni.yaml`'s open loop held 58 streams against 50, 73.8 %
continuous by the gaps rule against 94.7 %.)

**The first-step share** (``StepModel.first_step_share``: the stage's time on
prefills) hurts a stream only where it lands during the stream's playback: its own
cohort's prefill comes before its first audio. Of ``n`` streams in cohorts of ``c``, a
playing stream shares the stage with the prefills of the other ``n - c``, so the round
is charged ``share x (n - c) / (n - 1)`` (``foreign_share``): the whole share for
streams that arrive alone (``c = 1``, as before), none in lockstep. Measured on the
thinker at 0.6 ms a stream (``omnitrio bench --find-limit``), a closed loop of 36
clients arrived in cohorts of 13.5 at 27-29 streams, and the whole share (0.09-0.12)
was what held admission at 27, where 32 played through in lockstep.

**A round's last, partial batch** (``StepModel.round_s``): ``n`` streams in batches of
``b`` take ``n // b`` whole steps and one of ``r = n % b``. Where streams arrive one at
a time that last step runs at its own size; where they arrive in lockstep the stages'
loads come due together (a closed loop's waves) and the fixed caps past a whole number
of batches fail, so there it is charged as a whole batch: ``r + (b - r) x lockstep``,
``lockstep`` running from 0 for cohorts of 1 to 1 for cohorts of ``LOCKSTEP_COHORT`` or
more (``Cohorts.lockstep``; the same measure ``_margin.py`` keeps the margin by).
Scaled over a whole batch instead (``(c - 1) / (b - 1)``), the closed loop's cohorts of
12.7 at ``bench-qwen3-omni.yaml``'s talker (batches of 32) charged the seventh batch at
about 40 % and held 223 streams where the lockstep limit is 192, 13 % of them dry by the
gaps rule; its open loop (cohorts of 1.7) is where the partial batch matters: charged
whole, every count from 193 to 224 read the same factor, and ``scale``'s noise decided
whether the seventh batch was admitted.
"""

from __future__ import annotations

COHORT_HALF_LIFE_STREAMS = 256.0
"""Half-life, in arriving streams, of the past in ``Cohorts.size``."""
LOCKSTEP_COHORT = 4.0
"""Streams that arrive in cohorts of this many or more move in lockstep
(``Cohorts.lockstep``; none below 1, linear between; a whole batch where batches
hold fewer). qwen3's talker read 1.7 in open
loop and 12.7 in a closed loop."""

_KEEP = float(0.5 ** (1.0 / COHORT_HALF_LIFE_STREAMS))


class Cohorts:
    """The cohorts streams arrive at one stage in. Fed by ``StepModel.observe``."""

    def __init__(self) -> None:
        self._streams = 0.0  # weighted sums over cohorts: streams, and streams x size
        self._weighted = 0.0

    def stepped(self, num_first: int) -> None:
        """A step took ``num_first`` streams' first steps here: a cohort."""
        if num_first <= 0:
            return
        keep = _KEEP**num_first
        self._streams = self._streams * keep + num_first
        self._weighted = self._weighted * keep + float(num_first * num_first)

    @property
    def size(self) -> float:
        """The cohort a stream arrives in, on average (1 before any has arrived)."""
        return self._weighted / self._streams if self._streams > 0 else 1.0

    def lockstep(self, max_batch_size: int) -> float:
        """How far the streams move together: 0 for cohorts of 1 (arrivals alone), 1 for
        cohorts of ``LOCKSTEP_COHORT`` or more, linear between. A cohort is counted
        within a batch, so a stage whose batches hold fewer than ``LOCKSTEP_COHORT``
        is in lockstep at cohorts of a whole batch."""
        whole = max(2.0, min(LOCKSTEP_COHORT, float(max_batch_size)))
        return min(1.0, max(0.0, (self.size - 1.0) / (whole - 1.0)))

    def foreign_share(self, share: float, num_streams: int) -> float:
        """Of the stage's first-step ``share``, what ``num_streams`` streams' playback
        shares the stage with: the prefills of the streams outside a stream's cohort."""
        if num_streams <= 1:
            return share
        others = (num_streams - min(self.size, num_streams)) / (num_streams - 1)
        return share * others
