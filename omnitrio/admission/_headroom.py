"""Real-time headroom: each stage's step-time model, learned online, and the rule
that admits a stream only while every admitted stream still plays in real time.

A stage's step costs about ``intercept_s + per_stream_s * batch_size`` (a batched
forward pass), more when it takes some stream's first step there (a prefill).
``StepModel`` fits that line to the stage's *plain* steps (those that take no
stream's first step) by exponentially weighted least squares (slow: thousands of
steps), and keeps apart ``first_step_share``, the share of the stage's time its
first steps took beyond a plain step's: the cost of the streams that arrive,
which depends on how fast they arrive, not on how many are in a batch (one line
over every step reads prefills, denser as arrivals speed up, as a cost per
stream). A round then takes ``scale x line / (1 - share)``, ``share`` the part
of it other cohorts' first steps take during a stream's playback (``_cohort.py``), ``scale``
being the recent steps' measured over expected time (fast: tens of steps), each
step against a line fitted to steps of its own kind (with a first step or
without): a stage that slows down (a noisy neighbour) shows within a fraction of
a second, while a burst of arrivals, which the share already counts, does not
move ``scale`` as well.

With ``n`` streams a stage runs ``ceil(n / max_batch_size)`` steps per *round*
(each stream stepped once; the last, partial one charged at its own size where
streams arrive alone and as a whole batch where they arrive in lockstep,
``_cohort.py``); each stream-step yields, on average,
``audio_s_per_stream_step`` seconds of audio, learned too (``_yield.py``: the
steady-state yield of the streams that play, else that of completed streams, else a
lower bound). The stage keeps ``n`` streams in real time when
``realtime_factor(n) = audio_s_per_stream_step / round_s(n)`` is at least 1.
Here ``n`` counts a stage's *active* streams (with work there lately), not
those it holds idle. The pipeline admits a stream only while, with it, every
stage's factor is at least ``1 + margin``, the margin that stage keeps (at most
``realtime_margin``: ``_margin.py``; ``Pipeline._admit``), and
sheds streams only once a busy stage's factor has stayed below
``1 - 2 x realtime_margin`` for a quarter of a second while streams there are
past their playback deadlines (``Pipeline._after_round``, ``Admission.should_shed``):
``scale`` moves fast so admission sees a slowdown at once, and shedding asks for
it to be deep and to last, so the fast scale's noise sheds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from .._statistics import StepModelStatistics
from ._cohort import Cohorts
from ._count import largest_holding
from ._yield import StreamFlow, Yield

SHAPE_HALF_LIFE_STEPS = 2000.0
"""Half-life of a step in the fitted lines."""
SCALE_HALF_LIFE_STEPS = 24.0
"""Half-life of a step in ``scale`` (at 20 ms a step: about half a second)."""
MIN_STEPS = 32
"""Steps a stage takes before its model has an opinion."""
MIN_AUDIO_S = 0.5
"""Audio delivered (seconds, pipeline-wide) before any model has an opinion."""
MAX_FIRST_STEP_SHARE = 0.9
"""The most of a stage's time ``round_s`` leaves to first steps (prefills)."""
PRIOR_SLACK = 1.05
"""A declared step (``StepPrior``) is charged this much more than declared (``_prior.py``)."""
ERROR_HALF_LIFE_STEPS = 256.0
"""Half-life of a step in ``StepModel.step_error``."""
BURST_HALF_LIFE_STEPS = 4.0
"""Half-life of a step in ``StepModel.burst_share`` (about the steps a chunk takes)."""


def _keep(half_life: float) -> float:
    return float(0.5 ** (1.0 / half_life))


_SHAPE_KEEP = _keep(SHAPE_HALF_LIFE_STEPS)
_SCALE_KEEP = _keep(SCALE_HALF_LIFE_STEPS)
_ERROR_KEEP = _keep(ERROR_HALF_LIFE_STEPS)
_BURST_KEEP = _keep(BURST_HALF_LIFE_STEPS)

Factor: TypeAlias = "float | Callable[[StepModel, int, float], float]"
"""A realtime factor to keep: a number, or one asked of a stage's model for ``n`` streams
at the audio delivered so far (``Admission.needed_at``)."""


class _Line:
    """``intercept_s + per_stream_s * batch_size``, fitted to steps by exponentially
    weighted least squares."""

    def __init__(self) -> None:
        self._w = self._wb = self._wbb = self._wt = self._wbt = 0.0
        self.intercept_s = 0.0
        self.per_stream_s = 0.0
        self.mean_b = 0.0
        self.identified = False
        """Its steps' batch sizes vary enough to fit a slope (else it is their mean time)."""

    def add(self, batch_size: int, step_s: float) -> None:
        b, k = float(batch_size), _SHAPE_KEEP
        self._w = self._w * k + 1.0
        self._wb = self._wb * k + b
        self._wbb = self._wbb * k + b * b
        self._wt = self._wt * k + step_s
        self._wbt = self._wbt * k + b * step_s
        mean_b, mean_t = self._wb / self._w, self._wt / self._w
        var_b = self._wbb / self._w - mean_b * mean_b
        self.mean_b, self.identified = mean_b, var_b > 0.25
        slope = (self._wbt / self._w - mean_b * mean_t) / var_b if self.identified else 0.0
        self.per_stream_s = max(0.0, slope)
        self.intercept_s = max(0.0, mean_t - self.per_stream_s * mean_b)

    def __call__(self, batch_size: float) -> float:
        return self.intercept_s + self.per_stream_s * batch_size

    def beyond(self, batch_size: float) -> float:
        """A step of ``batch_size``; past the batch sizes seen, with no slope fitted (a
        first wave in lockstep), charged all per stream: the most it may cost, so
        admission past what was seen ramps up rather than leaps (``StepModel.ramp``)."""
        if self.identified or batch_size <= self.mean_b or self.mean_b <= 0:
            return self(batch_size)
        return self(batch_size) * batch_size / self.mean_b

    @property
    def fitted(self) -> bool:
        return self._w > 0


@dataclass(frozen=True, slots=True)
class StepPrior:
    """A stage's prior (``_prior.py``): a step of ``b`` streams takes ``step_s +
    per_stream_s x b`` and each stream-step yields ``audio_s_per_stream_step`` of audio."""

    step_s: float
    per_stream_s: float
    audio_s_per_stream_step: float


class StepModel:
    """One stage's online step-time model. Fed on the trio thread by its actor."""

    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.ramp = False
        """Past the batch sizes seen with no slope fitted, charge a step all per stream
        (``_Line.beyond``; the pipeline sets it with ``warmup_streams``: after a first
        wave in lockstep admission ramps up, where otherwise it would admit up to a
        whole batch at the first wave's step time)."""
        self.prior: StepPrior | None = None
        """What the stage declares a step costs and yields (``_prior.py``; the pipeline
        sets it under headroom admission): the model's opinion until it has measured
        the stage (``ready``; a first wave comes before any step), then the slope of
        its line until the measured one has a slope of its own (a first wave steps at
        one batch size), and its yield until the playing streams' is learned."""
        self.num_steps = 0
        self.num_stream_steps = 0
        self._plain = _Line()  # steps that take no stream's first step here
        self._first = _Line()  # steps that take some stream's first step (a prefill)
        self._busy_s = 0.0  # these four: weighted sums over every step, as the lines'
        self._first_n = self._first_b = self._first_t = 0.0  # over the first steps
        self.scale = 1.0
        self._burst_s = self._burst_first_s = 0.0  # weighted sums over the last few steps
        self._error_w = self._error_sq = 0.0  # weighted count and squares of plain steps' errors
        self.cohorts = Cohorts()
        self.audio = Yield()
        """The audio a stream-step yields here (``_yield.py``)."""

    def observe(self, batch_size: int, step_s: float, num_first: int = 0) -> None:
        """One step of ``batch_size`` streams took ``step_s``; ``num_first`` of them
        took their first step here (a prefill)."""
        if batch_size <= 0:
            return
        self.num_steps += 1
        self.num_stream_steps += batch_size
        first, k = num_first > 0, _SHAPE_KEEP
        kind = self._first if first else self._plain
        expected_s = self.scale * kind(batch_size) if kind.fitted else 0.0
        if not first and expected_s > 0:  # predicted before it was taken
            error = step_s / expected_s - 1.0
            self._error_w = self._error_w * _ERROR_KEEP + 1.0
            self._error_sq = self._error_sq * _ERROR_KEEP + error * error
        excess_s = max(0.0, step_s - self._plain_step_s(batch_size)) if first else 0.0
        self._burst_s = self._burst_s * _BURST_KEEP + step_s
        self._burst_first_s = self._burst_first_s * _BURST_KEEP + excess_s
        kind.add(batch_size, step_s)
        self.cohorts.stepped(num_first)
        expected = kind(batch_size)
        if expected > 0:
            self.scale = self.scale * _SCALE_KEEP + (step_s / expected) * (1 - _SCALE_KEEP)
        self._busy_s = self._busy_s * k + step_s
        self._first_n = self._first_n * k + first
        self._first_b = self._first_b * k + batch_size * first
        self._first_t = self._first_t * k + step_s * first

    @property
    def step_error(self) -> float | None:
        """The model's own error, lately: the root mean square of a plain step's time
        against what the model predicted for it just before (relative; None: no plain
        step was predicted yet)."""
        if self._error_w <= 0:
            return None
        return math.sqrt(self._error_sq / self._error_w)

    @property
    def first_step_share(self) -> float:
        """Share of the stage's time its steps spent beyond a plain step's on streams'
        first steps (prefills), lately."""
        line = self._plain
        if not line.fitted or self._busy_s <= 0:
            return 0.0
        plain_s = self._first_n * line.intercept_s + self._first_b * line.per_stream_s
        return min(MAX_FIRST_STEP_SHARE, max(0.0, self._first_t - plain_s) / self._busy_s)

    @property
    def burst_share(self) -> float:
        """``first_step_share`` over the last few steps (``BURST_HALF_LIFE_STEPS``): a
        burst of arrivals, whose prefills a stream's next chunk waits behind."""
        if self._burst_s <= 0:
            return 0.0
        return min(MAX_FIRST_STEP_SHARE, self._burst_first_s / self._burst_s)

    def round_s(self, num_streams: int, share: float | None = None) -> float:
        """Time to step each of ``num_streams`` streams once, at the recent pace, with
        the time the stage spends on other cohorts' first steps as it has lately (or
        ``share`` of it), and a partial last batch charged as far towards a whole one as
        the streams arrive in lockstep (``_cohort.py``)."""
        if num_streams <= 0:
            return 0.0
        batch = self.max_batch_size
        whole, rest = divmod(num_streams, batch)
        line = self._plain if self._plain.fitted else self._first
        if whole and rest:
            charged = rest + (batch - rest) * self.cohorts.lockstep(batch)
            step_s = whole * self._step_s(line, batch) + self._step_s(line, charged)
        else:
            step_s = max(1, whole) * self._step_s(line, min(num_streams, batch))
        share = self.first_step_share if share is None else share
        return self.scale * step_s / (1.0 - self.cohorts.foreign_share(share, num_streams))

    def _step_s(self, line: _Line, size: float) -> float:
        if self.ramp:
            return line.beyond(size)
        if self.prior is not None and not line.identified and line.mean_b > 0:
            return max(0.0, line(size) + self.prior.per_stream_s * (size - line.mean_b))
        return line(size)

    def prior_round_s(self, num_streams: int) -> float:
        """``round_s`` by the stage's declared cost (``prior``), ``PRIOR_SLACK`` over it."""
        prior = self.prior
        if prior is None or num_streams <= 0:
            return 0.0
        steps = math.ceil(num_streams / self.max_batch_size)
        size = min(num_streams, self.max_batch_size)
        return steps * PRIOR_SLACK * (prior.step_s + prior.per_stream_s * size)

    def stepped(self, flow: StreamFlow, num_steps: int, audio_s: float) -> None:
        """A stream took its ``num_steps``-th step here, ``audio_s`` of its audio delivered."""
        self.audio.stepped(flow, num_steps, audio_s)

    def completed(self, num_steps: int, audio_s: float) -> None:
        """A stream completed after ``num_steps`` steps here and ``audio_s`` of audio."""
        self.audio.completed(num_steps, audio_s)

    def audio_s_per_stream_step(self, audio_s_delivered: float) -> float:
        """The playing streams' yield; before they have played enough, the declared one
        (no padded last chunk, no lag in it), else completed streams', else the lower
        bound, ``audio_s_delivered`` over all stream-steps here."""
        playing = self.audio.playing
        if playing is not None:
            return playing
        if self.prior is not None:
            return self.prior.audio_s_per_stream_step
        completed = self.audio.of_completed
        if completed is not None:
            return completed
        if not self.num_stream_steps:
            return 0.0
        return audio_s_delivered / self.num_stream_steps

    def ready(self, audio_s_delivered: float) -> bool:
        return self.num_steps >= MIN_STEPS and (self.settled or audio_s_delivered >= MIN_AUDIO_S)

    @property
    def settled(self) -> bool:
        """A stream with audio completed here (its yield has no lag in it)."""
        return self.audio.settled

    def has_opinion(self, audio_s_delivered: float) -> bool:
        """Measured (``ready``), or declared (``prior``)."""
        return self.prior is not None or self.ready(audio_s_delivered)

    def realtime_factor(
        self, num_streams: int, audio_s_delivered: float, share: float | None = None
    ) -> float:
        """Audio seconds each of ``num_streams`` streams gets per second (inf: no
        opinion); by the declared ``prior`` until the stage is measured. ``share``: the
        first-step share to charge (default: lately's; the prior's, none)."""
        if self.ready(audio_s_delivered):
            round_s = self.round_s(num_streams, share)
        elif self.prior is not None:
            foreign = self.cohorts.foreign_share(share or 0.0, num_streams)
            round_s = self.prior_round_s(num_streams) / (1.0 - foreign)
        else:
            return math.inf
        if round_s <= 0:
            return math.inf
        return self.audio_s_per_stream_step(audio_s_delivered) / round_s

    def _plain_step_s(self, batch_size: int) -> float:
        """A plain step of ``batch_size``: measured, else as the ``prior`` charges it (a
        first wave's steps may all take first steps), else unknown (``inf``)."""
        if self._plain.fitted:
            return self._plain(batch_size)
        if self.prior is not None:
            return PRIOR_SLACK * (self.prior.step_s + self.prior.per_stream_s * batch_size)
        return math.inf

    def burst_factor(self, num_streams: int, audio_s_delivered: float) -> float:
        """``realtime_factor`` with the first steps of the last few steps
        (``burst_share``) where they took more of the stage than lately (inf: not)."""
        if self.ready(audio_s_delivered) and not self._plain.fitted:
            return math.inf  # measured: its steps' line holds their prefills already
        share = self.burst_share
        if share <= self.first_step_share:
            return math.inf
        return self.realtime_factor(num_streams, audio_s_delivered, share)

    def realtime_streams(self, audio_s_delivered: float, factor: Factor, cap: int) -> int:
        """The most streams (up to ``cap``) whose realtime factor stays at least ``factor``
        (a number, or what admission asks of this stage for ``n`` streams:
        ``Admission.needed_at``), in about ``2 log2(n)`` questions (``_count.py``)."""
        if not self.has_opinion(audio_s_delivered):
            return cap

        def holds(n: int) -> bool:
            wanted = (
                factor if isinstance(factor, float | int) else factor(self, n, audio_s_delivered)
            )
            return self.realtime_factor(n, audio_s_delivered) >= wanted

        return largest_holding(holds, cap)

    def statistics(
        self, audio_s_delivered: float, cap: int, factor: Factor = 1.0
    ) -> StepModelStatistics:
        """A snapshot; ``realtime_streams`` counts the streams kept at ``factor`` (the
        pipeline passes what admission asks, ``Admission.needed_at``)."""
        ready = self.has_opinion(audio_s_delivered)
        return StepModelStatistics(
            num_steps=self.num_steps,
            intercept_s=self._plain.intercept_s,
            per_stream_s=self._plain.per_stream_s,
            scale=self.scale,
            first_step_share=self.first_step_share,
            audio_s_per_stream_step=self.audio_s_per_stream_step(audio_s_delivered),
            realtime_streams=self.realtime_streams(audio_s_delivered, factor, cap) if ready else 0,
        )
