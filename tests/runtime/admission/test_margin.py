"""The margin a stage keeps (``_margin.py``), on made-up steps (no timing)."""

from __future__ import annotations

import pytest

from omnitrio.admission._headroom import StepModel, StepPrior
from omnitrio.admission._margin import MIN_MARGIN, stage_margin
from omnitrio.admission._rule import Admission

INTERCEPT_S, PER_STREAM_S = 0.008, 0.0002


def _stage(
    batch: int, cohort: int, yield_s: float, slowdowns: tuple[float, ...] = (1.0,)
) -> tuple[StepModel, float]:
    """A measured stage of ``batch``-stream batches whose streams arrive ``cohort`` to a
    step, each stream-step yielding ``yield_s`` (from completed streams); the steps take
    their line's time times ``slowdowns`` in turn. Returns it and the audio delivered."""
    model = StepModel(batch)
    for i in range(3000):
        size = 1 + i % batch
        first = cohort if i % 16 == 0 else 0
        step_s = (INTERCEPT_S + PER_STREAM_S * size) * slowdowns[i % len(slowdowns)]
        model.observe(size, step_s, min(first, size))
    model.completed(1000, 1000 * yield_s)
    return model, model.num_stream_steps * yield_s


def _round_yield(batch: int, steps: int, factor: float) -> float:
    """The yield a stream-step needs for a round of ``steps`` whole batches to read ``factor``."""
    return factor * steps * (INTERCEPT_S + PER_STREAM_S * batch)


def test_a_stage_that_steps_every_stream_at_once_keeps_only_its_models_error() -> None:
    # One batch a round, an exact model: at 1.035x real time (under the 1.05 asked
    # before), the stage has room for one more.
    model, audio_s = _stage(64, 1, _round_yield(64, 1, 1.035))
    admission = Admission(256, 0.05, headroom=True)
    assert model.realtime_factor(64, audio_s) == pytest.approx(1.035, rel=1e-3)
    assert admission.needed_at(model, 64, audio_s) == pytest.approx(1 + MIN_MARGIN)
    assert admission.refusal(63, 63, [("thinker", model)], audio_s) is None


def test_streams_in_lockstep_over_several_steps_keep_the_whole_margin() -> None:
    # Two steps a round at 1.035x: streams that arrive alone may be admitted, cohorts of
    # a whole batch (a closed loop's waves) are refused: deadline-first steps a cohort on
    # its way to its first audio ahead of the streams that play.
    yield_s = _round_yield(32, 2, 1.035)
    alone, audio_s = _stage(32, 1, yield_s)
    waves, waves_audio_s = _stage(32, 32, yield_s)
    admission = Admission(256, 0.05, headroom=True)
    assert alone.realtime_factor(64, audio_s) == pytest.approx(1.035, rel=1e-3)
    assert waves.realtime_factor(64, waves_audio_s) == pytest.approx(1.035, rel=1e-3)
    assert admission.refusal(63, 63, [("talker", alone)], audio_s) is None
    refusal = admission.refusal(63, 63, [("talker", waves)], waves_audio_s)
    assert refusal is not None
    assert refusal.problem is not None
    assert "ask for 1.05" in refusal.problem
    # In one step a round the cohorts do not matter: nobody waits behind them.
    assert admission.needed_at(waves, 32, waves_audio_s) == pytest.approx(1 + MIN_MARGIN)


def test_a_stage_whose_steps_err_keeps_more_margin() -> None:
    model, audio_s = _stage(64, 1, 0.02, slowdowns=(1.0,) * 5 + (1.5,))
    assert model.step_error is not None
    assert model.step_error > 0.15
    margin = stage_margin(model, 64, 0.05, 0.25, audio_s)
    assert margin > MIN_MARGIN
    assert margin <= 0.05
    # The error over the steps a client's buffer spans: a longer buffer averages more.
    assert stage_margin(model, 64, 0.05, 1.0, audio_s) < margin


def test_a_stage_judged_by_its_declaration_keeps_the_whole_margin() -> None:
    model = StepModel(64)
    model.prior = StepPrior(INTERCEPT_S, PER_STREAM_S, 0.02)
    assert model.step_error is None
    assert stage_margin(model, 64, 0.05, 0.25, 0.0) == 0.05
    measured, audio_s = _stage(64, 1, 0.02)
    assert stage_margin(measured, 64, 0.05, 0.25, audio_s) == MIN_MARGIN
    assert stage_margin(measured, 64, 0.01, 0.25, audio_s) == 0.01  # never above the config's


def test_a_stage_past_the_whole_margin_is_not_asked_for_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No stage keeps more than realtime_margin, so a stage whose factor clears that is
    # admitted without working out its own margin (half an admission's time at c=64).
    model, audio_s = _stage(64, 1, _round_yield(64, 1, 1.035))
    admission = Admission(256, 0.05, headroom=True)
    asked: list[int] = []
    needed_at = Admission.needed_at

    def counting(self: Admission, stage: StepModel, num_streams: int, audio: float) -> float:
        asked.append(num_streams)
        return needed_at(self, stage, num_streams, audio)

    monkeypatch.setattr(Admission, "needed_at", counting)
    assert model.realtime_factor(32, audio_s) > admission.needed
    assert admission.refusal(31, 31, [("thinker", model)], audio_s) is None
    assert asked == []
    # at the edge the stage's own margin decides, as before
    assert admission.refusal(63, 63, [("thinker", model)], audio_s) is None
    assert asked == [64]
    assert admission.refusal(64, 64, [("thinker", model)], audio_s) is not None
