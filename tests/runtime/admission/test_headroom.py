"""The step-time model and the admission/shedding rule, on made-up steps (no timing)."""

from __future__ import annotations

import math

import pytest

import omnitrio
from omnitrio._link import Link
from omnitrio._stream import DeliveryCounters, StreamHooks, StreamState
from omnitrio.admission._headroom import MIN_STEPS, StepModel, _Line
from omnitrio.admission._margin import MIN_MARGIN
from omnitrio.admission._rule import Admission, priority_of
from omnitrio.admission._yield import StreamFlow


def learned(
    intercept_s: float,
    per_stream_s: float,
    max_batch_size: int = 64,
    num_steps: int = 128,
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
    # two steps per round beyond the batch limit, the second of one stream (no stream
    # has arrived in a cohort: as if alone; ``test_cohort.py`` for lockstep)
    assert model.round_s(65) == pytest.approx(2 * 0.008 + 0.00015 * 65, rel=1e-4)


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


def test_short_answers_tolerate_what_their_client_buffers_long_ones_do_not() -> None:
    # A stream of A s of audio at f x real time ends A (1/f - 1) behind its playback:
    # admission keeps f >= (1 + margin) A / (A + client_buffer_s) once answers complete.
    model = learned(0.008, 0.00015, max_batch_size=256)
    audio_s = model.num_stream_steps * 0.02
    admission = Admission(256, 0.05, headroom=True, client_buffer_s=0.25)
    assert admission.needed == pytest.approx(1.05)  # nothing completed: the margin alone
    # The stage steps every stream at once and its model is exact: it keeps MIN_MARGIN.
    assert admission.needed_at(model, 1, audio_s) == pytest.approx(1 + MIN_MARGIN)
    before = model.realtime_streams(audio_s, admission.needed_at(model, 1, audio_s), 256)
    for _ in range(50):
        admission.completed(1.0, 0.64)  # 32 frames of 20 ms
    assert admission.needed == pytest.approx(1.05 * 0.64 / (0.64 + 0.25))
    needed = admission.needed_at(model, 1, audio_s)
    assert needed == pytest.approx((1 + MIN_MARGIN) * 0.64 / (0.64 + 0.25))
    after = model.realtime_streams(audio_s, needed, 256)
    assert after > before
    assert admission.refusal(after - 1, after - 1, [("thinker", model)], audio_s) is None
    assert admission.refusal(after, after, [("thinker", model)], audio_s) is not None
    # Shedding's hysteresis is scaled alike, below admission's threshold.
    assert admission.shed_below == pytest.approx(0.9 * 0.64 / 0.89)
    assert admission.shed_below < admission.needed
    # Long answers: the threshold tends to the margin again.
    for _ in range(200):
        admission.completed(60.0, 50.0)
    assert 1.0 < admission.needed < 1.05


def test_the_first_chunk_is_made_before_its_client_plays_so_it_is_not_counted() -> None:
    # Only the audio after the first chunk is made while the client plays: 0.56 s of
    # a 0.64 s answer whose first chunk is 80 ms.
    admission = Admission(256, 0.05, headroom=True, client_buffer_s=0.25)
    for _ in range(50):
        admission.completed(1.0, 0.64, 0.08)
    assert admission.needed == pytest.approx(1.05 * 0.56 / (0.56 + 0.25))
    admission.completed(1.0, 0.08, 0.08)  # a one-chunk answer: nothing made while it played
    assert admission.needed == pytest.approx(1.05 * 0.56 / (0.56 + 0.25))


def test_the_retry_hint_is_the_time_until_the_oldest_stream_ends() -> None:
    admission = Admission(4, 0.05, headroom=True)
    admission.completed(2.0)
    refusal = admission.refusal(4, 4, [], 10.0, oldest_age_s=1.5)
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx(0.5)  # mean lifetime 2 s, oldest at 1.5 s
    overdue = admission.refusal(4, 4, [], 10.0, oldest_age_s=3.0)
    assert overdue is not None
    # past every lifetime seen: the first of the four live streams to end, not the floor
    assert overdue.retry_after_s == pytest.approx(0.5)


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
    # It keeps what admission would let in: the margin this stage keeps (``_margin.py``),
    # at most the whole 5 %.
    keep = model.realtime_streams(audio_s, admission.needed_at, 100)
    assert keep >= model.realtime_streams(audio_s, 1.05, 100)
    # Above the shedding threshold (1 - 2 x margin) nothing is shed; below, the rest go.
    assert admission.shed_below == pytest.approx(0.9)
    assert not admission.behind(model, model.realtime_streams(audio_s, 0.9, 100), audio_s)
    count = model.realtime_streams(audio_s, 0.9, 100) + 1
    streams = _streams(count, {0: -1.0})  # the oldest asked to go first
    assert admission.behind(model, count, audio_s)
    admission.shed("thinker", model, streams, audio_s)
    shed = [s.id for s in streams if s.failure is not None]
    assert admission.num_shed == len(shed) == count - keep
    assert shed == ["s0", *(f"s{i}" for i in range(keep + 1, count))]
    error = streams[0].failure
    assert isinstance(error, omnitrio.StreamShed)
    assert error.stage == "thinker"


def test_shedding_keeps_the_streams_admission_would_let_back_in() -> None:
    """A stage whose model is right keeps less than the whole margin; shedding keeps the
    streams at that margin too, so admission does not let straight back in a stream
    that shedding has just failed."""
    model = learned(0.008, 0.00015, max_batch_size=128, num_steps=4000)
    audio_s = model.num_stream_steps * 0.02
    model.completed(100, 100 * 0.02)
    admission = Admission(256, 0.05, headroom=True)
    admitted = model.realtime_streams(audio_s, admission.needed_at, 256)
    assert admitted > model.realtime_streams(audio_s, admission.needed, 256)
    streams = _streams(admitted + 8, {})
    admission.shed("thinker", model, streams, audio_s)
    assert sum(s.failure is None for s in streams) == admitted


def test_priority_must_be_a_number() -> None:
    assert priority_of(omnitrio.Request("x", options={"priority": 2})) == 2.0
    with pytest.raises(ValueError, match="priority must be a number"):
        priority_of(omnitrio.Request("x", options={"priority": "high"}))


# Shedding reacts to a real, sustained slowdown and never to the model's noise: the
# tests below drive a stage's model and its shedding watch on virtual time (a step of
# ``STEP_S`` per round, the clock passed in), not on the machine's timing.
STEP_S = 0.02


def _at_the_admission_edge() -> tuple[StepModel, float, int]:
    """A settled model (streams completed at 20 ms of audio per stream-step) and the
    most streams admission lets in: the stage runs at the edge of its margin (its model
    exact and its streams arriving alone, it keeps ``MIN_MARGIN``: ``_margin.py``)."""
    model = learned(0.008, 0.00015, max_batch_size=128, num_steps=4000)
    model.completed(256, 256 * 0.02)
    audio_s = model.num_stream_steps * 0.02
    return model, audio_s, model.realtime_streams(audio_s, 1 + MIN_MARGIN, 256)


def _run(
    admission: Admission,
    model: StepModel,
    audio_s: float,
    num_streams: int,
    slowdowns: list[float],
    start_s: float = 100.0,
) -> tuple[float | None, float]:
    """One round per slowdown factor (the step's measured over learned time), the
    stage busy throughout and a stream late at every round; the virtual time of the
    first round after which the stage would shed (None: never) and the lowest factor
    the fast model showed."""
    now_s, busy_s, lowest = start_s, 0.0, math.inf
    batch = min(num_streams, model.max_batch_size)
    for slowdown in slowdowns:
        step_s = slowdown * (0.008 + 0.00015 * batch)
        model.observe(batch, step_s)
        now_s += STEP_S * slowdown
        busy_s += STEP_S * slowdown
        lowest = min(lowest, model.realtime_factor(num_streams, audio_s))
        if admission.should_shed(
            "thinker", model, num_streams, audio_s, now_s=now_s, busy_s=busy_s, num_late=1
        ):
            return now_s, lowest
    return None, lowest


def test_noise_in_the_model_around_the_margin_sheds_nothing() -> None:
    model, audio_s, _ = _at_the_admission_edge()
    admission = Admission(256, 0.05, headroom=True)
    # Bursts of slow steps (prefills as a wave of streams completes and new ones are
    # admitted): 8 steps at 1.5x in every 48, for 20 s; once, 10 steps at 1.6x.
    bursts = [1.5] * 8 + [1.0] * 40
    noise = bursts * 10 + [1.6] * 10 + [1.0] * 40 + bursts * 10
    # At the edge of the whole margin: what a stage whose steps err so keeps (_margin.py).
    admitted = model.realtime_streams(audio_s, 1.05, 256)
    shed_at_s, lowest = _run(admission, model, audio_s, admitted, noise)
    # The fast model dipped below 1 - margin (the rule before: it shed here) ...
    assert lowest < 1 - admission.realtime_margin
    # ... and below the shedding threshold, but not for long enough: nothing is shed.
    assert lowest < admission.shed_below
    assert shed_at_s is None
    assert admission.num_shed == 0


def test_a_sustained_slowdown_sheds_the_newest_streams_with_stream_shed() -> None:
    model, audio_s, admitted = _at_the_admission_edge()
    admission = Admission(256, 0.05, headroom=True)
    start_s = 100.0
    # The thinker's steps 1.3x slower for 10 s (the benchmark's fault).
    shed_at_s, _ = _run(admission, model, audio_s, admitted, [1.3] * 400, start_s)
    assert shed_at_s is not None, "a 1.3x slowdown for 10 s was never shed"
    assert shed_at_s - start_s < 1.5  # within a second and a half of the slowdown
    assert model.realtime_factor(admitted, audio_s) < admission.shed_below
    streams = _streams(admitted, {})
    for stream in streams:
        stream.deadline_s = shed_at_s + 0.1  # all about to run out of audio ...
    streams[-1].deadline_s = shed_at_s + 10.0  # ... but the newest, 10 s ahead
    admission.shed("thinker", model, streams, audio_s, now_s=shed_at_s)
    shed = [s for s in streams if s.failure is not None]
    keep = model.realtime_streams(audio_s, admission.needed_at, admitted)
    assert 0 < len(shed) == admitted - keep == admission.num_shed
    # Newest first, but the stream far ahead of its deadline will not miss it: kept.
    assert [s.id for s in shed] == [f"s{i}" for i in range(keep - 1, admitted - 1)]
    for stream in shed:
        assert isinstance(stream.failure, omnitrio.StreamShed)
        assert stream.failure.stage == "thinker"
    # What is kept plays in real time again, with the margin admission keeps there.
    assert model.realtime_factor(keep, audio_s) >= admission.needed_at(model, keep, audio_s) > 1.0


def test_shedding_waits_for_a_busy_stage_and_a_late_stream() -> None:
    model, audio_s, admitted = _at_the_admission_edge()
    for _ in range(200):
        model.observe(64, 1.3 * (0.008 + 0.00015 * 64))
    assert model.realtime_factor(admitted, audio_s) < 0.9
    admission = Admission(256, 0.05, headroom=True)
    idle = [
        admission.should_shed(
            "tts", model, admitted, audio_s, now_s=t * 0.1, busy_s=t * 0.02, num_late=1
        )
        for t in range(1, 50)
    ]
    assert not any(idle)  # busy 20 % of the time: the stage is not what makes them late
    on_time = [
        admission.should_shed(
            "thinker", model, admitted, audio_s, now_s=t * 0.1, busy_s=t * 0.1, num_late=0
        )
        for t in range(1, 50)
    ]
    assert not any(on_time)  # no stream is late: nothing to protect yet


def test_idle_held_streams_are_not_charged_against_headroom() -> None:
    model, audio_s, admitted = _at_the_admission_edge()
    admission = Admission(256, 0.05, headroom=True)
    models = [("tts", model)]
    # Charged every live stream, the stage has no room for one more ...
    assert admission.refusal(admitted, admitted, models, audio_s) is not None
    # ... but if most of them are held idle there, it does.
    assert admission.refusal(admitted, admitted, models, audio_s, {"tts": 3}) is None
    refusal = admission.refusal(admitted, admitted, models, audio_s, {"tts": admitted})
    assert refusal is not None
    assert refusal.problem is not None
    assert f"with {admitted + 1} active streams" in refusal.problem


def test_streams_active_upstream_are_charged_downstream_they_are_on_their_way() -> None:
    # A first wave a deadline-first thinker serves cohort by cohort: the later cohorts
    # have work at the thinker but have had none at the talker for a while.
    model, audio_s, admitted = _at_the_admission_edge()
    admission = Admission(512, 0.05, headroom=True)
    models = [("thinker", learned(0.001, 0.00001)), ("talker", model)]
    assert models[0][1].realtime_factor(admitted + 1, audio_s) > 2  # never the thinker's
    idle_here = {"thinker": admitted, "talker": admitted - 32}
    refusal = admission.refusal(admitted, admitted, models, audio_s, idle_here)
    assert refusal is not None
    assert refusal.problem is not None
    assert f"with {admitted + 1} active streams stage 'talker'" in refusal.problem
    # Streams idle at every stage up to the talker are still not charged there.
    idle = {"thinker": admitted - 32, "talker": admitted - 32}
    assert admission.refusal(admitted, admitted, models, audio_s, idle) is None


# Before any stream completed, a stage's yield comes from the streams that play: the
# tests below drive a stage's model with streams whose audio lags their steps here,
# as a pipeline's stages do (virtual rounds: every live stream stepped once each).
YIELD_S = 0.02  # audio one step here becomes: the true yield
LAG_STEPS = 12  # steps between one here and its audio reaching the client
CHUNK_STEPS = 4  # audio is delivered in chunks of this many steps' worth


def _delivered_s(age: int, length: int) -> float:
    """Audio a stream of ``length`` steps here has had delivered ``age`` rounds after its
    first step: each step's audio arrives ``LAG_STEPS`` rounds later, in chunks."""
    made = max(0, min(age - LAG_STEPS, length))
    return YIELD_S * CHUNK_STEPS * (made // CHUNK_STEPS)


def _early_run(model: StepModel, num_rounds: int, arrive_every: int, length: int) -> float:
    """Streams arrive every ``arrive_every`` rounds and take ``length`` steps here; the
    rounds stop before the first stream's audio has all reached its client (no stream
    completed). Returns the audio delivered pipeline-wide."""
    assert num_rounds - LAG_STEPS < length
    flows: list[StreamFlow] = []
    steps: list[int] = []
    for round_ in range(num_rounds):
        if round_ % arrive_every == 0:
            flows.append(StreamFlow())
            steps.append(0)
        stepping = [i for i, n in enumerate(steps) if n < length]
        model.observe(len(stepping), 0.012 + 0.00015 * len(stepping))
        for i in stepping:
            steps[i] += 1
            age = round_ - i * arrive_every + 1
            model.stepped(flows[i], steps[i], _delivered_s(age, length))
    return sum(_delivered_s(num_rounds - i * arrive_every, length) for i in range(len(steps)))


def test_before_any_completion_the_yield_is_the_playing_streams_pace_not_all_steps() -> None:
    model = StepModel(64)
    delivered_s = _early_run(model, num_rounds=70, arrive_every=4, length=60)  # 18 streams
    assert not model.settled
    # Audio delivered over every step taken reads the lag as a low yield (the old
    # estimate: two thirds of the truth here) ...
    assert delivered_s / model.num_stream_steps < 0.7 * YIELD_S
    # ... the playing streams' steps and audio since their first audio, counted up to
    # the latest step at which more audio had come (the chunks' lag left out), read
    # the pace; audio after a stream's last step here (its tail, still on its way) is
    # not counted, so it does not read high.
    estimate = model.audio_s_per_stream_step(delivered_s)
    assert estimate == pytest.approx(YIELD_S)
    # So a stage that would make 1.27 s of audio a second for each of 19 streams admits
    # the 19th; with the old estimate (a factor of 0.90) it refused.
    admission = Admission(256, 0.05, headroom=True)
    assert model.realtime_factor(19, delivered_s) > 1.25
    assert admission.refusal(18, 18, [("thinker", model)], delivered_s) is None


def test_a_padded_last_chunk_is_not_read_as_yield() -> None:
    # A talker-like stage: a frame (80 ms) a step, windows of 25 frames (2 s) reach the
    # client 3 steps after their last frame; the last window of a 112-frame answer is
    # padded (2 s for 12 frames) and comes after the stream's last step here.
    model = StepModel(32)
    for _ in range(8):  # eight streams, one after another
        flow = StreamFlow()
        for step in range(1, 113):
            model.observe(1, 0.01)
            model.stepped(flow, step, 2.0 * max(0, (step - 3) // 25))
        model.completed(112, 10.0)
    # Over whole streams: 10 s over 112 steps, 89 ms a step; a client hears 80.
    assert 10.0 / 112 > 1.1 * 0.08
    assert model.audio_s_per_stream_step(80.0) == pytest.approx(0.08)


def test_before_streams_play_enough_the_yield_is_the_lower_bound() -> None:
    model = StepModel(64)
    delivered_s = _early_run(model, num_rounds=20, arrive_every=5, length=60)
    # under MIN_FLOW_AUDIO_S played past first chunks: audio over all steps, as before
    assert delivered_s > 0
    assert model.audio_s_per_stream_step(delivered_s) == delivered_s / model.num_stream_steps


def _steady(every_first: int, num_steps: int = 4000) -> StepModel:
    """A thinker-like stage at ~40 streams: a step costs 8 ms + 0.15 ms a stream, and
    21.6 ms more when it takes a stream's first step (a prefill), one step in
    ``every_first``; streams completed at 20 ms of audio per step."""
    model = StepModel(64)
    for i in range(num_steps):
        b, first = 36 + i % 9, int(i % every_first == 0)
        model.observe(b, 0.008 + 0.00015 * b + 0.0216 * first, first)
    model.completed(256, 256 * YIELD_S)
    return model


def test_a_burst_of_prefills_does_not_move_scale_a_slowdown_does() -> None:
    model = _steady(every_first=5)
    audio_s = 100.0
    before = model.realtime_factor(41, audio_s)
    assert 1.07 < before < 1.12  # the line averages the prefills in: ~1.09 at 41
    admission = Admission(256, 0.05, headroom=True)
    assert admission.refusal(40, 40, [("thinker", model)], audio_s) is None
    # A cluster of arrivals: five steps in a row take a stream's first step.
    for b in (40, 41, 42, 43, 44):
        model.observe(b, 0.008 + 0.00015 * b + 0.0216, 1)
    assert 0.98 < model.scale < 1.02  # each was as long as such steps are
    assert model.realtime_factor(41, audio_s) > 0.98 * before
    # Only the burst's own steps refuse (``test_cohort.py``): a stream's next chunk waits
    # behind them; a few plain steps later it has passed, and nothing of it stays.
    refusal = admission.refusal(40, 40, [("thinker", model)], audio_s)
    assert refusal is not None
    assert "last steps' prefills" in str(refusal)
    for b in (40, 41, 42, 43, 44, 40, 41, 42):
        model.observe(b, 0.008 + 0.00015 * b)
    assert admission.refusal(40, 40, [("thinker", model)], audio_s) is None
    # A slowdown of every step, prefills too, still shows within tens of steps.
    slow = _steady(every_first=5)
    for i in range(64):
        b, first = 36 + i % 9, int(i % 5 == 0)
        slow.observe(b, 1.3 * (0.008 + 0.00015 * b + 0.0216 * first), first)
    assert 1.2 < slow.scale < 1.31


def test_prefills_are_a_share_of_the_stage_time_not_a_cost_per_stream() -> None:
    """Streams arriving faster and faster (the run's first half second): each arrival
    adds a stream to the batch and its first step costs a 21.6 ms prefill once."""
    model, old = StepModel(64), _Line()
    total_s = prefill_s = 0.0
    for b, steps_at_b in enumerate((20, 10, 6, 4, 3), start=1):
        for i in range(steps_at_b):
            first = int(i == 0)
            step_s = 0.008 + 0.00015 * b + 0.0216 * first
            model.observe(b, step_s, first)
            old.add(b, step_s)
            total_s, prefill_s = total_s + step_s, prefill_s + 0.0216 * first
    # One line over every step reads the prefills, denser as streams arrive faster,
    # as a cost per stream (the old model: over 1 ms, against 0.15) ...
    assert old.per_stream_s > 0.001
    # ... the model keeps them apart: a plain step's line, and the share of the
    # stage's time its first steps took beyond that.
    stats = model.statistics(audio_s_delivered=10.0, cap=64)
    assert stats.per_stream_s == pytest.approx(0.00015, rel=1e-3)
    assert stats.first_step_share == pytest.approx(prefill_s / total_s, rel=0.02)
    assert model.round_s(6) == pytest.approx((0.008 + 0.0009) / (1 - prefill_s / total_s), rel=0.02)
    assert model.round_s(6) < 0.8 * old(6)


def test_with_one_batch_size_seen_a_larger_batch_is_charged_all_per_stream() -> None:
    # No slope can be fitted to steps of one size (a first wave in lockstep). With
    # ramp (the pipeline sets it with warmup_streams) the model charges the step to its
    # streams, so admission past it ramps up, never leaps; without, it reads the first
    # wave's step time for any batch (an open loop's first streams are not refused).
    model = StepModel(128)
    for _ in range(4 * MIN_STEPS):
        model.observe(32, 0.008 + 0.0006 * 32)
    assert model.round_s(64) == pytest.approx(0.0272)
    model.ramp = True
    assert model.round_s(32) == pytest.approx(0.0272)
    assert model.round_s(64) == pytest.approx(2 * 0.0272)  # the true line: 0.0464
    # Once batches vary, the line is fitted.
    fitted = learned(0.008, 0.0006, max_batch_size=128)
    fitted.ramp = True
    assert fitted.round_s(64) == pytest.approx(0.008 + 0.0006 * 64, rel=1e-4)
