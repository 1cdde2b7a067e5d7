"""The cohorts streams arrive at a stage in (``omnitrio/admission/_cohort.py``) and what
they change in headroom's round: the first-step share a playing stream shares the stage
with. On made-up steps (no timing)."""

from __future__ import annotations

import pytest

from omnitrio.admission._cohort import Cohorts
from omnitrio.admission._headroom import StepModel
from omnitrio.admission._rule import Admission


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


def test_lockstep_runs_from_streams_alone_to_cohorts_of_four() -> None:
    assert Cohorts().lockstep(32) == 0.0  # nothing arrived: as if alone
    for cohort, lockstep in ((1, 0.0), (2, 1 / 3), (4, 1.0), (13, 1.0)):
        cohorts = Cohorts()
        for _ in range(50):
            cohorts.stepped(cohort)
        assert cohorts.lockstep(32) == pytest.approx(lockstep)


def test_a_stage_whose_batches_hold_fewer_than_four_is_in_lockstep_at_a_whole_batch() -> None:
    """A cohort is counted within a batch: at batches of 2 it is 2 at most, and two
    streams that always arrive together are as much in lockstep as it can show."""
    for batch, cohort, lockstep in ((2, 2, 1.0), (3, 2, 0.5), (3, 3, 1.0), (1, 1, 0.0)):
        cohorts = Cohorts()
        for _ in range(50):
            cohorts.stepped(cohort)
        assert cohorts.lockstep(batch) == pytest.approx(lockstep)


def _talker(cohort: int) -> StepModel:
    """``bench-qwen3-omni.yaml``'s talker as its model read: 6.1 ms + 0.165 ms a stream,
    batches of 32, learned from steps of 24-32 streams, its streams arriving in cohorts
    of ``cohort`` (one every eight steps)."""
    model = StepModel(32)
    for i in range(512):
        b = 24 + i % 9
        first = cohort if i % 8 == 0 else 0
        model.observe(b, 0.0061 + 0.000165 * b, first)  # the prefill costs nothing extra
    return model


def test_a_rounds_partial_last_batch_is_charged_by_how_the_streams_arrive() -> None:
    alone, waves = _talker(1), _talker(16)
    assert alone.first_step_share == 0.0
    whole = 6 * (0.0061 + 0.000165 * 32)
    assert waves.round_s(200) == pytest.approx(whole + 0.0061 + 0.000165 * 32)
    assert alone.round_s(200) == pytest.approx(whole + 0.0061 + 0.000165 * 8)
    # Whole batches, and a round of one batch, are charged alike either way.
    assert alone.round_s(192) == pytest.approx(waves.round_s(192))
    assert alone.round_s(20) == pytest.approx(waves.round_s(20))


def test_headroom_admits_a_partial_batch_more_for_streams_that_arrive_alone() -> None:
    """Measured on ``bench-qwen3-omni.yaml`` (``--find-limit 192,224``): its closed loop
    (cohorts of 12.7 at the talker) keeps 192 streams and fails at 224; its open loop
    (cohorts of 1.7) keeps 224. With the seventh batch charged whole in both, every
    count from 193 to 224 read the same factor and the open loop held 84-96 % of 224."""
    models = {cohort: _talker(cohort) for cohort in (1, 16)}
    # 80 ms of audio a stream-step; steps at 0.98 of 1.0x for 224, so that 224 streams
    # keep just the 2 % margin: charged whole, the seventh batch is refused (192 held).
    for model in models.values():
        model.completed(100, 100 * 7 * (0.0061 + 0.000165 * 32) * 0.98)

    def admitted(cohort: int) -> int:
        admission = Admission(256, 0.05, headroom=True)
        for _ in range(20):  # answers of 8.96 s, the first 2 s in the first chunk
            admission.completed(9.5, 8.96, 2.0)
        live = 192
        while (
            live < 256 and admission.refusal(live, live, [("talker", models[cohort])], 1e3) is None
        ):
            live += 1
        return live

    assert admitted(16) == 192  # the seventh batch charged whole: refused
    assert admitted(1) >= 210  # charged at its own size: most of it admitted (221)


def _open_thinker() -> StepModel:
    """``bench-omni.yaml``'s thinker (8 ms + 0.15 ms a stream, 20 ms of audio a step) in
    an open loop: 45-52 streams, a stream arriving alone every third step (its prefill:
    21.6 ms beyond a plain step), for long enough that the share is settled."""
    model = StepModel(64)
    for i in range(3000):
        b = 45 + i % 8
        first = 1 if i % 3 == 0 else 0
        model.observe(b, 0.008 + 0.00015 * b + (0.0216 if first else 0.0), first)
    model.completed(32, 0.64)
    return model


def test_a_burst_of_prefills_holds_admission_until_it_has_passed() -> None:
    """Measured (a probe of ``bench-omni.yaml``'s open loop at 128.7 arrivals/s):
    a stream's chunk that came over 100 ms late had 79-96 admissions a second in its
    gap, against 26-33 over the run; slots freed together fill one arrival to a step,
    each with a prefill, so the thinker's next few steps run at half pace although its
    share over thousands of steps keeps real time. Refused through the burst, the
    arrivals wait and then share a prefill."""
    model = _open_thinker()
    admission = Admission(80, 0.05, headroom=True)
    for _ in range(20):  # answers of 0.64 s, the first 80 ms in the first chunk
        admission.completed(0.9, 0.64, 0.08)

    def refused() -> bool:
        return admission.refusal(50, 50, [("thinker", model)], 100.0) is not None

    assert not refused()  # the share over thousands of steps keeps the answers' pace
    for _ in range(6):  # a burst: a stream arriving at each of six steps in a row
        model.observe(50, 0.008 + 0.00015 * 50 + 0.0216, 1)
    assert model.burst_share > model.first_step_share
    assert refused()
    for _ in range(8):  # plain steps: the burst has passed
        model.observe(50, 0.008 + 0.00015 * 50)
    assert not refused()


def test_a_burst_at_a_stage_that_then_has_no_work_does_not_hold_admission() -> None:
    """A stage whose last steps were prefills and which then has no active stream takes
    no step, so its last steps' share stays where the burst left it; were it asked,
    every arrival would be refused until the last live stream ended."""
    model = _open_thinker()
    admission = Admission(80, 0.05, headroom=True)
    for _ in range(20):
        admission.completed(0.9, 0.64, 0.08)
    for _ in range(4):  # a burst of long prefills, then no work
        model.observe(50, 0.15, 1)
    assert model.burst_share > model.first_step_share
    idle = {"thinker": 0}
    assert admission.refusal(50, 50, [("thinker", model)], 100.0, num_active=idle) is None
    busy = {"thinker": 50}  # the same burst at a stage that is stepping still refuses
    assert admission.refusal(50, 50, [("thinker", model)], 100.0, num_active=busy) is not None
