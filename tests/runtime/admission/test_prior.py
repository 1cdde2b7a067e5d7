"""What stages declare a step costs and yields (``omnitrio/admission/_prior.py``), and
the first wave it bounds before anything is measured: on declarations, on the bench
configs' synthetic stages, then on a real pipeline."""

from __future__ import annotations

import contextlib
import math

import pytest
import trio

import omnitrio
from omnitrio.admission._headroom import PRIOR_SLACK, StepModel, StepPrior
from omnitrio.admission._prior import StepCost, compose, declared_cost, declared_priors
from omnitrio.admission._rule import Admission
from tests.conftest import chain_config
from tests.runtime.admission.test_admission import STAGES


def test_the_chain_composes_each_stages_yield_from_the_audio_its_outputs_become() -> None:
    # bench-qwen3-omni's shape: a token makes 3.5 codec frames, a window of 25 frames
    # makes 2 s of audio.
    thinker = StepCost(0.007, 0.00035)
    talker = StepCost(0.006, 0.00015, steps_per_input=3.5)
    vocoder = StepCost(
        0.011, 0.0003, steps_per_input=1 / 25, outputs_per_step=0, audio_s_per_step=2
    )
    priors = compose([thinker, talker, vocoder])
    yields = [p.audio_s_per_stream_step if p else None for p in priors]
    assert yields == pytest.approx([0.28, 0.08, 2.0])
    assert priors[1] == StepPrior(0.006, 0.00015, pytest.approx(0.08))
    # A stage that declares nothing leaves every stage before it without a yield.
    assert compose([thinker, None, vocoder])[:2] == [None, None]
    assert compose([thinker, None, vocoder])[2] == StepPrior(0.011, 0.0003, 2.0)
    # A chain that makes no audio has no prior.
    assert compose([thinker, StepCost(0.001, 0.0)]) == [None, None]


def test_a_declaration_must_be_numbers_of_at_least_zero() -> None:
    with pytest.raises(ValueError, match="per_stream_s"):
        StepCost(0.001, -0.1)
    with pytest.raises(ValueError, match="steps_per_input"):
        StepCost(0.001, 0.0, steps_per_input=0)
    with pytest.raises(TypeError, match="step_s"):
        StepCost(True, 0.0)  # type: ignore[arg-type]

    class Wrong:
        @classmethod
        def step_cost(cls, params: object) -> object:
            return (0.001, 0.0)

    with pytest.raises(TypeError, match="not a StepCost"):
        declared_cost(Wrong, {})
    assert declared_cost(object, {}) is None


def test_the_synthetic_stages_declare_their_profile() -> None:
    priors = declared_priors(omnitrio.load_config("configs/bench-qwen3-omni.yaml"))
    assert priors["thinker"] == StepPrior(0.007, 0.00035, pytest.approx(0.28))
    assert priors["talker"] == StepPrior(0.006, 0.00015, pytest.approx(0.08))
    assert priors["code2wav"] == StepPrior(0.011, 0.0003, pytest.approx(2.0))
    omni = declared_priors(omnitrio.load_config("configs/bench-omni.yaml"))
    assert [p.audio_s_per_stream_step for p in omni.values()] == pytest.approx([0.02, 0.02, 0.08])


def test_a_step_cost_that_refuses_its_params_is_a_config_error_naming_the_stage() -> None:
    config = chain_config([{"steps": 4}, {"service_time_ms": "slow"}])
    with pytest.raises(omnitrio.ConfigError, match=r"stage b\.params.*service_time_ms"):
        declared_priors(config)


def test_before_any_step_a_first_wave_is_admitted_only_as_far_as_the_prior_keeps() -> None:
    # bench-qwen3-omni's talker: 7 batches of 32 take 7 x 10.8 ms for an 80 ms frame,
    # 1.06x real time by its profile, which its steps on shared cores do not keep; 6
    # batches (192 streams, the true limit) take 64.8 ms.
    talker = StepModel(32)
    talker.prior = StepPrior(0.006, 0.00015, 0.08)
    assert talker.realtime_streams(0.0, 1.05, 256) == 192
    admission = Admission(256, 0.05, headroom=True)
    models = [("talker", talker)]
    assert admission.refusal(191, 191, models, 0.0) is None
    refusal = admission.refusal(192, 192, models, 0.0)
    assert refusal is not None
    assert refusal.problem is not None
    assert "stage 'talker'" in refusal.problem
    factor = 0.08 / (7 * PRIOR_SLACK * (0.006 + 0.00015 * 32))
    assert talker.realtime_factor(193, 0.0) == pytest.approx(factor)
    # Without a declaration the first wave is admitted blind, as before.
    assert admission.refusal(255, 255, [("talker", StepModel(32))], 0.0) is None


def test_once_measured_at_one_batch_size_the_prior_gives_the_line_its_slope() -> None:
    model = StepModel(128)
    model.prior = StepPrior(0.008, 0.0006, 0.02)
    for _ in range(64):  # a first wave in lockstep: every step at 16
        model.observe(16, 0.0176)
    assert model.ready(10.0)
    # measured at 16, the declared 0.6 ms a stream beyond it (flat, it read 17.6 ms)
    assert model.round_s(16) == pytest.approx(0.0176)
    assert model.round_s(32) == pytest.approx(0.0176 + 0.0006 * 16)
    # the yield is the declared one until the playing streams' is learned
    assert model.audio_s_per_stream_step(0.5) == pytest.approx(0.02)


def test_a_first_wave_arriving_one_prefill_a_step_is_held_by_its_burst() -> None:
    """Measured (a probe of ``bench-omni.yaml``'s open loop at 130 arrivals/s, the burst
    check of the eleventh session): every stream left over a 100 ms gap had it in the
    first 0.36 s, before the thinker was measured, 3.5 % of the streams; its steps there
    took 41 ms (a prefill of 20 ms and more in each) against the 16 ms the prior charges a
    plain step, and the burst check, asked only of a measured stage, let them in."""
    thinker = StepModel(64)
    thinker.prior = StepPrior(0.008, 0.00015, 0.02)
    admission = Admission(80, 0.05, headroom=True)
    models = [("thinker", thinker)]
    assert not thinker.ready(0.0)
    assert admission.refusal(40, 40, models, 0.0) is None  # the prior keeps 40
    for n in range(1, 9):  # an arrival at each step, each with a prefill
        thinker.observe(5 * n, 0.008 + 0.00015 * 5 * n + 0.0216, 1)
    assert not thinker.ready(0.0)
    assert thinker.burst_factor(41, 0.0) < thinker.realtime_factor(41, 0.0)
    refusal = admission.refusal(40, 40, models, 0.0)
    assert refusal is not None
    assert refusal.problem is not None
    assert "prefills counted" in refusal.problem
    for _ in range(12):  # plain steps: the burst has passed
        thinker.observe(40, 0.008 + 0.00015 * 40)
    assert admission.refusal(40, 40, models, 0.0) is None


async def test_a_real_pipeline_refuses_a_burst_beyond_what_the_stages_declare() -> None:
    # Stage b declares 1 ms + 4 ms a stream for 20 ms of audio a step: four streams
    # keep real time at 1.05x with the prior's slack, five do not. Nothing is measured
    # within the burst (32 steps and 0.5 s of audio), so before, all eight were admitted.
    config = chain_config(STAGES, max_streams=8, max_batch_size=8, client_capacity=8)
    request = omnitrio.Request("x", options={"steps": 2000})
    async with omnitrio.open_pipeline(config) as pipeline:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(4):
                await stack.enter_async_context(pipeline.open_stream(request))
            with pytest.raises(omnitrio.Overloaded) as refused:
                async with pipeline.open_stream(request):
                    pass
            assert refused.value.problem is not None
            assert "stage 'b'" in refused.value.problem
            assert pipeline.statistics().num_refused_headroom == 1
        await trio.lowlevel.checkpoint()


def test_a_measured_stage_whose_steps_all_took_a_prefill_is_not_charged_its_burst_twice() -> None:
    """An open loop dense enough to put an arrival in every step: the stage is measured
    (its line of steps with first steps holds the prefills) but has no plain step to fit.
    Its burst is not measured against the prior's plain step and charged on top of that
    line again (a review's finding: refused at about half its capacity until a plain step)."""
    thinker = StepModel(64)
    thinker.prior = StepPrior(0.008, 0.00015, 0.02)
    for _ in range(40):
        thinker.observe(20, 0.008 + 0.00015 * 20 + 0.0216, 1)
    assert thinker.ready(100.0)
    assert thinker.burst_factor(21, 100.0) == math.inf
