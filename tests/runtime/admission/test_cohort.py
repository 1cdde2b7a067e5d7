"""The cohorts streams arrive at a stage in (``omnitrio/admission/_cohort.py``) and what
they change in headroom's round: the first-step share a playing stream shares the stage
with. On made-up steps (no timing)."""

from __future__ import annotations

import pytest

from omnitrio.admission._cohort import Cohorts
from omnitrio.admission._headroom import StepModel


def test_a_cohort_is_the_first_steps_of_one_step() -> None:
    cohorts = Cohorts()
    assert cohorts.size == 1.0  # nothing arrived: as if alone
    for _ in range(6):  # a first wave of 192 in six prefill steps of 32
        cohorts.stepped(32)
    cohorts.stepped(0)
    assert cohorts.size == pytest.approx(32)
    alone = Cohorts()
    for _ in range(100):  # an open loop: a stream a step, for a hundred steps in a row
        alone.stepped(1)
    assert alone.size == pytest.approx(1.0)


def test_only_the_other_cohorts_prefills_land_during_a_streams_playback() -> None:
    cohorts = Cohorts()
    assert cohorts.foreign_share(0.1, 30) == pytest.approx(0.1)  # alone: the whole share
    for _ in range(10):  # cohorts of 15
        cohorts.stepped(15)
    assert cohorts.foreign_share(0.1, 30) == pytest.approx(0.1 * 15 / 29)
    assert cohorts.foreign_share(0.1, 15) == 0.0  # one cohort: its prefill came first
    assert cohorts.foreign_share(0.1, 1) == pytest.approx(0.1)


def _thinker(cohort: int, num_cohorts: int = 20) -> StepModel:
    """The thinker at 0.6 ms a stream (8 ms + 0.6 ms x b, 20 ms of audio a step), its
    streams arriving in cohorts of ``cohort`` (a 38 ms prefill each, one in 12 steps:
    11 % of its time on prefills), ``num_cohorts`` cohorts' steps of 24-31 streams."""
    model = StepModel(64)
    for i in range(num_cohorts):
        for j in range(12):
            b = 24 + (i + j) % 8
            first = cohort if j == 0 else 0
            model.observe(b, 0.008 + 0.0006 * b + (0.038 if first else 0.0), first)
    model.completed(32, 0.64)
    return model


def test_streams_that_arrive_together_are_not_charged_their_own_prefills() -> None:
    """Measured (``omnitrio bench --find-limit`` on the 0.6 ms profile): a closed loop's
    completions send streams back together, and 32 streams in lockstep play through for
    a buffering listener. With the whole share charged the thinker read 27-28 streams;
    charging only the other cohorts' prefills, it reads what lockstep keeps."""
    audio_s = 100.0
    needed = 1.05 * 0.56 / (0.56 + 0.25)  # answers of 0.64 s, 80 ms first chunk
    together, alone = _thinker(cohort=27), _thinker(cohort=1)
    assert together.first_step_share == pytest.approx(alone.first_step_share)
    assert 0.09 < together.first_step_share < 0.2
    assert alone.realtime_streams(audio_s, needed, 64) <= 28  # as before
    assert together.realtime_streams(audio_s, needed, 64) >= 31
