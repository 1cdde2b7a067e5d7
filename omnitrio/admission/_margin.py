"""The margin headroom keeps at one stage: what its model cannot see, no more.

Admission asks every stage for ``(1 + margin) x A / (A + B)`` (``_rule.py``). A fixed
``pipeline.realtime_margin`` of 5 % everywhere held ``bench-qwen3-omni.yaml``'s open
loop at 84 % of its limit, and the thinker at 0.6 ms a stream at 94 % of its buffered
one, while their models were right to within 1-3 %. The margin has two jobs, and
each is measured at the stage (``stage_margin``):

- **The model's own error.** ``StepModel.step_error`` is a plain step's time against
  what the model predicted just before it (root mean square, lately). A client buffer
  of ``B`` absorbs a deficit shorter than itself, so what could run a stream dry is
  the error over the steps the stage takes in ``B``; independent errors average
  over those as ``step_error / sqrt(steps)``. Probed under headroom: 1-8 % a step,
  1.5-3 % over the seven steps of a round of 224 at qwen3's talker.
- **Arrivals in lockstep where a round takes several steps.** A cohort of streams
  that arrive together (``Cohorts.lockstep``, ``_cohort.py``) is on its way to its first
  audio, the tightest deadline there is, so deadline-first steps it ahead of the
  streams already playing, step after step: where a round is one step every active
  stream steps in it and none waits behind another, but where it is several the
  playing streams wait behind the cohort's steps for as long as it takes to reach
  its first chunk. The model charges that work, not its bunching, so there the full
  ``realtime_margin`` is kept. Measured with the margin at 2-3 % everywhere
  (``--find-limit``'s headroom runs, a probe): qwen3's closed loop, whose streams
  reach the talker in cohorts of 12.7 over seven steps a round, went from 192 (all
  continuous) to 224 with 8-22 % of the streams dry by the gaps rule; its open loop,
  cohorts of 1.7, rose from 84 % to 97 % of its limit and played through.

Elsewhere the stage keeps ``MIN_MARGIN``: no lower, as the model's error a step is not
all independent and a short answer's ``A / (A + B)`` is itself an approximation.
The margin is never above ``realtime_margin``, and a stage judged by what it declares
(``_prior.py``, before it is measured) keeps all of it.
"""

from __future__ import annotations

import math

from ._headroom import StepModel

MIN_MARGIN = 0.02
"""The least margin a stage keeps (its model measured)."""


def stage_margin(
    model: StepModel,
    num_streams: int,
    realtime_margin: float,
    client_buffer_s: float,
    audio_s_delivered: float,
) -> float:
    """The margin ``model``'s stage keeps with ``num_streams`` active streams: at most
    ``realtime_margin``; that where the model has not measured the stage, or where its
    streams arrive in lockstep and a round takes several steps; else the model's error
    over the steps the stage takes while a client plays its buffer, at least
    ``MIN_MARGIN``."""
    error = model.step_error
    if error is None or num_streams <= 0 or not model.ready(audio_s_delivered):
        return realtime_margin
    steps = math.ceil(num_streams / model.max_batch_size)
    lockstep = model.cohorts.lockstep(model.max_batch_size) if steps > 1 else 0.0
    round_s = model.round_s(num_streams)
    rounds = client_buffer_s / round_s if round_s > 0 else 1.0
    noise = error / math.sqrt(steps * max(1.0, rounds))
    return min(realtime_margin, max(MIN_MARGIN, noise, realtime_margin * lockstep))
