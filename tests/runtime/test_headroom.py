"""The step-time model and the admission/shedding rule, on made-up steps (no timing)."""

from __future__ import annotations

import math

import pytest

import omnitrio
from omnitrio._admission import Admission, priority_of
from omnitrio._headroom import MIN_STEPS, StepModel
from omnitrio._link import Link
from omnitrio._stream import DeliveryCounters, StreamHooks, StreamState


def learned(
    intercept_s: float,
    per_stream_s: float,
    max_batch_size: int = 64,
    num_steps: int = 4 * MIN_STEPS,
) -> StepModel:
    model = StepModel(max_batch_size)
    for i in range(num_steps):
        b = 1 + i % max_batch_size
        model.observe(b, intercept_s + per_stream_s * b)
    return model


def test_the_model_learns_the_step_line_from_steps_of_varied_batch_sizes() -> None:
    model = learned(0.008, 0.00015)
    stats = model.statistics(audio_s_delivered=10.0, cap=256)
    assert stats.intercept_s == pytest.approx(0.008, rel=1e-6)
    assert stats.per_stream_s == pytest.approx(0.00015, rel=1e-6)
    assert stats.scale == pytest.approx(1.0, rel=1e-4)
    # two steps of 64 per round beyond the batch limit
    assert model.round_s(65) == pytest.approx(2 * (0.008 + 0.00015 * 64), rel=1e-4)


def test_a_slowdown_shows_in_scale_within_tens_of_steps() -> None:
    model = learned(0.008, 0.00015, num_steps=4000)  # a stage that has run a while
    for _ in range(64):
        model.observe(32, 1.3 * (0.008 + 0.00015 * 32))
    assert 1.2 < model.scale < 1.31


def test_realtime_streams_is_the_largest_count_whose_factor_holds() -> None:
    model = learned(0.008, 0.00015, max_batch_size=128)
    audio_s = model.num_stream_steps * 0.019  # each stream-step made 19 ms of audio
    n = model.realtime_streams(audio_s, 1.0, 256)
    assert model.realtime_factor(n, audio_s) >= 1.0 > model.realtime_factor(n + 1, audio_s)
    assert n == math.floor((0.019 - 0.008) / 0.00015)  # 73: one step a round
    # beyond the batch limit a round takes two steps
    capped = learned(0.008, 0.00015)
    assert capped.realtime_streams(capped.num_stream_steps * 0.019, 1.0, 256) == 64


def test_no_opinion_before_enough_steps_and_audio() -> None:
    model = StepModel(8)
    model.observe(4, 1.0)
    assert model.realtime_factor(100, 100.0) == math.inf
    assert learned(0.5, 0.5).realtime_factor(100, 0.0) == math.inf  # no audio yet


def test_admission_refuses_the_stream_that_would_break_real_time_with_a_hint() -> None:
    model = learned(0.008, 0.00015)
    audio_s = model.num_stream_steps * 0.02
    admission = Admission(256, 0.05, headroom=True)
    limit = model.realtime_streams(audio_s, 1.05, 256)
    assert admission.refusal(limit - 1, limit - 1, [("thinker", model)], audio_s) is None
    refusal = admission.refusal(limit, limit, [("thinker", model)], audio_s)
    assert isinstance(refusal, omnitrio.Overloaded)
    assert refusal.problem is not None
    assert "thinker" in refusal.problem
    assert refusal.retry_after_s is None  # no stream completed yet: no estimate
    admission.completed(4.0)
    hinted = admission.refusal(limit, limit, [("thinker", model)], audio_s)
    assert hinted is not None
    assert hinted.retry_after_s == pytest.approx(4.0 / limit)
    # max_streams stays a hard cap; the first stream is always admitted
    assert admission.refusal(0, 0, [("thinker", learned(1.0, 1.0))], audio_s) is None
    capped = Admission(2, 0.05, headroom=True).refusal(1, 2, [], audio_s)
    assert capped is not None
    assert capped.problem is None


def _streams(count: int, priorities: dict[int, float]) -> list[StreamState]:
    ended: list[str] = []
    hooks = StreamHooks(lambda s: ended.append(s.id), lambda s: None, DeliveryCounters(), 1.0)
    streams = []
    for i in range(count):
        stream = StreamState(
            f"s{i}", omnitrio.Request("x"), Link("client", 4), {}, frozenset(), hooks
        )
        stream.admitted_at_s = float(i)  # s0 oldest
        stream.priority = priorities.get(i, 0.0)
        streams.append(stream)
    return streams


def test_shedding_keeps_what_the_stage_can_carry_newest_and_lowest_priority_go_first() -> None:
    model = learned(0.008, 0.00015)
    audio_s = model.num_stream_steps * 0.02
    admission = Admission(256, 0.05, headroom=True)
    assert not admission.behind(model, 200, audio_s)  # no stream completed: no shedding
    model.completed(100, 100 * 0.02)
    for _ in range(200):
        model.observe(64, 2.0 * (0.008 + 0.00015 * 64))  # the stage got 2x slower
    keep = model.realtime_streams(audio_s, 1.05, 100)
    # Between 1 - margin and 1 + margin nothing is shed; below, the rest go.
    assert not admission.behind(model, model.realtime_streams(audio_s, 0.95, 100), audio_s)
    count = model.realtime_streams(audio_s, 0.95, 100) + 1
    streams = _streams(count, {0: -1.0})  # the oldest asked to go first
    assert admission.behind(model, count, audio_s)
    admission.shed("thinker", model, streams, audio_s)
    shed = [s.id for s in streams if s.failure is not None]
    assert admission.num_shed == len(shed) == count - keep
    assert shed == ["s0", *(f"s{i}" for i in range(keep + 1, count))]
    error = streams[0].failure
    assert isinstance(error, omnitrio.StreamShed)
    assert error.stage == "thinker"


def test_priority_must_be_a_number() -> None:
    assert priority_of(omnitrio.Request("x", options={"priority": 2})) == 2.0
    with pytest.raises(ValueError, match="priority must be a number"):
        priority_of(omnitrio.Request("x", options={"priority": "high"}))
