"""The guards beside the step models (``omnitrio/admission/_guards.py``): a first wave
before any model is ready, and a live stream behind its playback; on made-up models,
then on a real pipeline."""

from __future__ import annotations

import time

import pytest
import trio

import omnitrio
from omnitrio._link import Link
from omnitrio._stream import DeliveryCounters, StreamHooks, StreamState
from omnitrio.admission._guards import LATE_SHARE, WARMUP_MAX_S, Warmup
from omnitrio.admission._headroom import StepModel
from omnitrio.admission._rule import Admission
from tests.conftest import chain_config
from tests.runtime.admission.test_admission import STAGES
from tests.runtime.admission.test_headroom import learned


def test_before_any_model_is_ready_a_first_wave_gets_warmup_streams() -> None:
    models = [("thinker", StepModel(32)), ("talker", StepModel(64))]
    admission = Admission(256, 0.05, headroom=True, warmup_streams=32)
    assert Warmup(32).window(models, 256, 0.0) == 32
    assert admission.refusal(31, 31, models, 0.0) is None
    refusal = admission.refusal(32, 32, models, 0.0)
    assert refusal is not None
    assert refusal.problem is not None
    assert "no stage has a step-time model yet" in refusal.problem
    assert "warmup_streams" in refusal.problem
    # max_streams bounds it; unset (the default), a first wave is admitted blind.
    assert Warmup(32).window(models, 16, 0.0) == 16
    assert Warmup().window(models, 256, 0.0) is None
    assert Admission(256, 0.05, headroom=True).refusal(100, 100, models, 0.0) is None
    # Once some stage's model has an opinion, it decides, for good.
    ready = learned(0.001, 0.0001)
    audio_s = ready.num_stream_steps * 0.02
    assert admission.refusal(32, 32, [("thinker", ready), models[1]], audio_s) is None
    assert admission.refusal(32, 32, models, 0.0) is None
    # max_streams admission has no warm-up.
    admits = Admission(256, 0.05, headroom=False, warmup_streams=32)
    assert admits.refusal(100, 100, models, 0.0) is None


def test_the_warm_up_ends_with_a_completion_or_its_time_for_a_pipeline_without_audio() -> None:
    models = [("llm", StepModel(4))]
    completed = Admission(256, 0.05, headroom=True, warmup_streams=4)
    assert completed.refusal(4, 4, models, 0.0) is not None
    completed.completed(1.0)  # a text answer: no audio, no model will be ready
    assert completed.refusal(4, 4, models, 0.0) is None
    timed = Admission(256, 0.05, headroom=True, warmup_streams=4)
    assert timed.refusal(4, 4, models, 0.0, now_s=10.0) is not None
    assert timed.refusal(4, 4, models, 0.0, now_s=10.0 + WARMUP_MAX_S / 2) is not None
    assert timed.refusal(4, 4, models, 0.0, now_s=10.1 + WARMUP_MAX_S) is None


def test_no_stream_is_admitted_while_a_live_stream_is_behind_its_playback() -> None:
    model = learned(0.001, 0.0001)  # room for hundreds of streams
    audio_s = model.num_stream_steps * 0.02
    admission = Admission(256, 0.05, headroom=True, client_buffer_s=0.25)
    over_s = LATE_SHARE * 0.25
    models = [("thinker", model)]
    assert admission.refusal(8, 8, models, audio_s, most_lag_s=lambda: over_s - 0.01) is None
    refusal = admission.refusal(8, 8, models, audio_s, most_lag_s=lambda: over_s + 0.01)
    assert refusal is not None
    assert refusal.problem is not None
    assert "after its client ran out" in refusal.problem
    # The step models refuse first where they would (the lag is asked last).
    asked: list[bool] = []
    tight = learned(0.008, 0.002)
    admission.refusal(
        64, 64, [("thinker", tight)], audio_s, most_lag_s=lambda: asked.append(True) or 0.0
    )
    assert not asked


def _stream(hooks: StreamHooks) -> StreamState:
    return StreamState("s0", omnitrio.Request("x"), Link("client", 4), {}, frozenset(), hooks)


def test_a_streams_lag_is_how_long_a_player_from_its_first_chunk_waited() -> None:
    hooks = StreamHooks(lambda s: None, lambda s: None, DeliveryCounters(), 1.0)
    stream = _stream(hooks)
    start_s = time.perf_counter()
    stream.put_audio(0.08, start_s)  # the first chunk: the player starts
    assert stream.lag_s == 0.0
    stream.put_audio(0.08, start_s + 0.05)  # in time
    assert stream.lag_s == 0.0
    stream.put_audio(0.08, start_s + 0.26)  # 160 ms had played by 0.16 s: 0.1 s late
    assert stream.lag_s == pytest.approx(0.1)


async def test_a_real_pipeline_admits_a_burst_up_to_warmup_streams_then_refuses() -> None:
    config = chain_config(STAGES, max_streams=32, max_batch_size=32, client_capacity=8)
    section = config.pipeline.model_copy(update={"warmup_streams": 2})
    config = config.model_copy(update={"pipeline": section})
    request = omnitrio.Request("x", options={"steps": 2000})
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream(request), pipeline.open_stream(request):
            with pytest.raises(omnitrio.Overloaded) as refused:
                async with pipeline.open_stream(request):
                    pass
            assert refused.value.problem is not None
            assert "no stage has a step-time model yet" in refused.value.problem
            assert pipeline.statistics().num_refused_headroom == 1
        await trio.lowlevel.checkpoint()
