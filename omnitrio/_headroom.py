"""Real-time headroom: each stage's step-time model, learned online, and the rule
that admits a stream only while every admitted stream still plays in real time.

A stage's step costs about ``intercept_s + per_stream_s * batch_size`` (a batched
forward pass). ``StepModel`` fits that line to the stage's own steps by
exponentially weighted least squares (slow: thousands of steps) and multiplies it
by ``scale``, the recent steps' measured over fitted time (fast: tens of steps),
so a stage that slows down (a noisy neighbour, a longer prompt mix) shows within
a fraction of a second while the line's shape stays well conditioned.

With ``n`` streams a stage runs ``ceil(n / max_batch_size)`` steps per *round*
(each stream stepped once); each stream-step yields, on average,
``audio_s_per_stream_step`` seconds of audio, learned too: over the streams that
completed, their audio over the steps they took here (``completed``). Before
the first completion it is audio delivered so far over all stream-steps taken,
an underestimate (a stage's steps run ahead of the audio they become), so early
admission errs on the side of refusing, and nothing is shed on it. The stage
keeps ``n`` streams in real time when
``realtime_factor(n) = audio_s_per_stream_step / round_s(n)`` is at least 1.
Here ``n`` counts a stage's *active* streams (with work there lately), not
those it holds idle. The pipeline admits a stream only while, with it, every
stage's factor is at least ``1 + realtime_margin`` (``Pipeline._admit``), and
sheds streams only once a busy stage's factor has stayed below
``1 - 2 x realtime_margin`` for a quarter of a second while streams there are
past their playback deadlines (``Pipeline._after_round``, ``Admission.should_shed``):
``scale`` moves fast so admission sees a slowdown at once, and shedding asks for
it to be deep and to last, so the fast scale's noise sheds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SHAPE_HALF_LIFE_STEPS = 2000.0
"""Half-life of a step in the fitted line."""
SCALE_HALF_LIFE_STEPS = 24.0
"""Half-life of a step in ``scale`` (at 20 ms a step: about half a second)."""
MIN_STEPS = 32
"""Steps a stage takes before its model has an opinion."""
MIN_AUDIO_S = 0.5
"""Audio delivered (seconds, pipeline-wide) before any model has an opinion."""
YIELD_KEEP = 0.98
"""Weight of the past in the audio per stream-step, per completed stream."""


def _keep(half_life: float) -> float:
    return float(0.5 ** (1.0 / half_life))


_SHAPE_KEEP = _keep(SHAPE_HALF_LIFE_STEPS)
_SCALE_KEEP = _keep(SCALE_HALF_LIFE_STEPS)


@dataclass(frozen=True)
class StepModelStatistics:
    """A stage's learned step-time model (``StageStatistics.step_model``)."""

    num_steps: int
    intercept_s: float
    per_stream_s: float
    scale: float
    """Recent steps' time over the fitted line's (1.3: 30 % slower than learned)."""
    audio_s_per_stream_step: float
    """Seconds of audio one stream-step at this stage yields (0 before any audio)."""
    realtime_streams: int
    """The most streams this stage keeps in real time now (0: no opinion yet)."""


class StepModel:
    """One stage's online step-time model. Fed on the trio thread by its actor."""

    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.num_steps = 0
        self.num_stream_steps = 0
        self._w = self._wb = self._wbb = self._wt = self._wbt = 0.0
        self._intercept_s = 0.0
        self._per_stream_s = 0.0
        self.scale = 1.0
        self.num_completed = 0
        self._yield_audio_s = 0.0
        self._yield_steps = 0.0

    def observe(self, batch_size: int, step_s: float) -> None:
        """One step of ``batch_size`` streams took ``step_s``."""
        if batch_size <= 0:
            return
        self.num_steps += 1
        self.num_stream_steps += batch_size
        b, k = float(batch_size), _SHAPE_KEEP
        self._w = self._w * k + 1.0
        self._wb = self._wb * k + b
        self._wbb = self._wbb * k + b * b
        self._wt = self._wt * k + step_s
        self._wbt = self._wbt * k + b * step_s
        mean_b, mean_t = self._wb / self._w, self._wt / self._w
        var_b = self._wbb / self._w - mean_b * mean_b
        slope = (self._wbt / self._w - mean_b * mean_t) / var_b if var_b > 0.25 else 0.0
        self._per_stream_s = max(0.0, slope)
        self._intercept_s = max(0.0, mean_t - self._per_stream_s * mean_b)
        fitted = self._line_s(batch_size)
        if fitted > 0:
            self.scale = self.scale * _SCALE_KEEP + (step_s / fitted) * (1 - _SCALE_KEEP)

    def _line_s(self, batch_size: int) -> float:
        return self._intercept_s + self._per_stream_s * batch_size

    def round_s(self, num_streams: int) -> float:
        """Time to step each of ``num_streams`` streams once, at the recent pace."""
        if num_streams <= 0:
            return 0.0
        batch = self.max_batch_size
        steps = math.ceil(num_streams / batch)
        return steps * self.scale * self._line_s(min(num_streams, batch))

    def completed(self, num_steps: int, audio_s: float) -> None:
        """A stream completed after ``num_steps`` steps here and ``audio_s`` of audio."""
        if num_steps <= 0:
            return
        self.num_completed += 1
        self._yield_audio_s = self._yield_audio_s * YIELD_KEEP + audio_s
        self._yield_steps = self._yield_steps * YIELD_KEEP + num_steps

    def audio_s_per_stream_step(self, audio_s_delivered: float) -> float:
        if self._yield_steps > 0 and self._yield_audio_s > 0:
            return self._yield_audio_s / self._yield_steps
        if not self.num_stream_steps:
            return 0.0
        return audio_s_delivered / self.num_stream_steps

    def ready(self, audio_s_delivered: float) -> bool:
        return self.num_steps >= MIN_STEPS and (
            self._yield_audio_s > 0 or audio_s_delivered >= MIN_AUDIO_S
        )

    @property
    def settled(self) -> bool:
        """Its audio per stream-step comes from completed streams (no lag in it)."""
        return self._yield_audio_s > 0

    def realtime_factor(self, num_streams: int, audio_s_delivered: float) -> float:
        """Audio seconds each of ``num_streams`` streams gets per second (inf: no opinion)."""
        round_s = self.round_s(num_streams)
        if not self.ready(audio_s_delivered) or round_s <= 0:
            return math.inf
        return self.audio_s_per_stream_step(audio_s_delivered) / round_s

    def realtime_streams(self, audio_s_delivered: float, factor: float, cap: int) -> int:
        """The most streams (up to ``cap``) whose realtime factor stays at least ``factor``."""
        if not self.ready(audio_s_delivered):
            return cap
        per_step = self.audio_s_per_stream_step(audio_s_delivered)
        best = 0
        for n in range(1, cap + 1):  # round_s grows with n: stop at the first miss
            if per_step < factor * self.round_s(n):
                break
            best = n
        return best

    def statistics(self, audio_s_delivered: float, cap: int) -> StepModelStatistics:
        ready = self.ready(audio_s_delivered)
        return StepModelStatistics(
            num_steps=self.num_steps,
            intercept_s=self._intercept_s,
            per_stream_s=self._per_stream_s,
            scale=self.scale,
            audio_s_per_stream_step=self.audio_s_per_stream_step(audio_s_delivered),
            realtime_streams=self.realtime_streams(audio_s_delivered, 1.0, cap) if ready else 0,
        )
