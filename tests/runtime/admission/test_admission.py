"""Admission by real-time headroom on a real pipeline: the decision is checked against
the statistics it was made on (``docs/design.md``, "Admission"), not against timing."""

from __future__ import annotations

import math

import pytest
import trio

import omnitrio
from omnitrio.admission._rule import Admission
from tests.conftest import chain_config

# b makes 20 ms of audio per stream-step and costs 1 ms + 4 ms per stream in the
# batch: a handful of streams keep real time, however fast the machine is.
STAGES = [
    {"steps": 100_000, "visible_every": 0},
    {
        "outputs_per_input": 0,
        "visible": "audio",
        "audio_samples": 320,
        "service_time_ms": 1.0,
        "per_stream_ms": 4.0,
    },
]


async def _read(pipeline: omnitrio.Pipeline, steps: int, done: trio.Event | None = None) -> None:
    request = omnitrio.Request("x", options={"steps": steps})
    async with pipeline.open_stream(request) as stream:
        async for _ in stream:
            pass
    if done is not None:
        done.set()


def _factor(stage: omnitrio.StageStatistics, num_streams: int, max_batch_size: int) -> float:
    model = stage.step_model
    assert model is not None
    batch = min(num_streams, max_batch_size)
    steps = math.ceil(num_streams / max_batch_size)
    round_s = steps * model.scale * (model.intercept_s + model.per_stream_s * batch)
    return model.audio_s_per_stream_step / round_s


async def test_a_stream_is_refused_once_a_stage_would_fall_behind_real_time() -> None:
    config = chain_config(STAGES, max_streams=32, max_batch_size=32, client_capacity=8)
    async with omnitrio.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
        # Learn: streams of different lengths, so b sees batches of 3, 2 and 1.
        done = [trio.Event() for _ in range(3)]
        for index, event in enumerate(done):
            nursery.start_soon(_read, pipeline, 40 * (index + 1), event)
        for event in done:
            await event.wait()
        assert pipeline.statistics().num_completed == 3
        # Open long streams until one is refused.
        refusal: omnitrio.Overloaded | None = None
        for _ in range(32):
            try:
                stream_cm = pipeline.open_stream(omnitrio.Request("y", options={"steps": 2000}))
                stream = await stream_cm.__aenter__()
            except omnitrio.Overloaded as exc:
                refusal = exc
                break
            nursery.start_soon(_drain, stream, stream_cm)
        stats = pipeline.statistics()
        nursery.cancel_scope.cancel()
    assert refusal is not None, "the headroom never ran out (max_streams is 32)"
    assert refusal.problem is not None
    assert "'b'" in refusal.problem
    assert refusal.retry_after_s is not None  # three streams completed: there is an estimate
    assert stats.num_refused_headroom == stats.num_refused == 1
    live = stats.num_open_streams
    margin = config.pipeline.realtime_margin
    # The invariant, on the statistics the decision was made on: with one more stream
    # b would fall below 1 + margin x real time; the first stream is always admitted.
    assert live >= 1
    assert _factor(stats.stages["b"], live + 1, 32) < 1 + margin
    assert stats.stages["b"].step_model is not None
    assert stats.stages["b"].step_model.per_stream_s > 0


async def _drain(stream: omnitrio.Stream, stream_cm: object) -> None:
    try:
        async for _ in stream:
            pass
    finally:
        with trio.CancelScope(shield=True):
            await stream_cm.__aexit__(None, None, None)  # type: ignore[attr-defined]


def test_a_refusals_retry_hint_is_when_its_oldest_stream_is_expected_to_end() -> None:
    """Streams of 1, 2, 4 and 8 s completed; the cap is full and its oldest stream has run
    3 s. Of the lifetimes longer than that, the mean excess is (1 + 5) / 2 = 3 s: the hint,
    not the mean lifetime less the age (below zero, so the 50 ms floor: a client told to
    come back at once, refused again). One that outlived them all leaves the wait for the
    first of the live streams to end: the mean lifetime over their count."""
    admission = Admission(2, 0.05, headroom=False)
    for lifetime_s in (1.0, 2.0, 4.0, 8.0):
        admission.completed(lifetime_s)
    mean = (1.0 + 2.0 + 4.0 + 8.0) / 4
    refusal = admission.refusal(2, 2, [], 0.0, oldest_age_s=3.0)
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx(3.0)
    refusal = admission.refusal(2, 2, [], 0.0, oldest_age_s=9.0)
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx(mean / 2)
