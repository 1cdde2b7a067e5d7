"""Admission that waits instead of refusing (``omnitrio/admission/_wait.py``): the queue
on the virtual clock, then on real pipelines (``pipeline.admission_wait_s``)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import omnitrio
from omnitrio.admission import _rule
from omnitrio.admission._wait import AdmissionQueue
from tests.conftest import chain_config
from tests.runtime.admission.test_admission import STAGES


class Room:
    """Room for ``free`` more streams; each attempt without room is refused with a
    ``hint_s`` retry hint."""

    def __init__(self, free: int = 0, hint_s: float | None = 10.0) -> None:
        self.free = free
        self.hint_s = hint_s
        self.admitted: list[str] = []

    def refusal(self) -> omnitrio.Overloaded | None:
        return None if self.free > 0 else omnitrio.Overloaded(1, self.hint_s, "no room")

    def attempt(self, name: str) -> str:
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        self.free -= 1
        self.admitted.append(name)
        return name


async def _ask(queue: AdmissionQueue, room: Room, name: str) -> None:
    await queue.admit(lambda: room.attempt(name), room.refusal)


async def test_waiters_are_admitted_first_in_first_out_and_no_newcomer_goes_before_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = AdmissionQueue(30.0, 8, 1), Room()
    async with trio.open_nursery() as nursery:
        for name in ("w0", "w1", "w2"):
            nursery.start_soon(_ask, queue, room, name)
            await trio.sleep(0.01)  # they arrive in this order
        assert queue.statistics().num_waiting == 3
        room.free = 1  # room for one more, and a newcomer arrives before anyone is told
        nursery.start_soon(_ask, queue, room, "late")
        await trio.sleep(0.01)
        assert room.admitted == []  # it queued behind them, it did not take the room
        queue.wake()
        await trio.sleep(0.01)
        assert room.admitted == ["w0"]
        for _ in range(3):
            room.free = 1
            queue.wake()
            await trio.sleep(0.01)
    assert room.admitted == ["w0", "w1", "w2", "late"]
    stats = queue.statistics()
    assert (stats.num_admitted, stats.num_refused, stats.num_left) == (4, 0, 0)
    assert stats.num_waiting == 0
    assert stats.longest_s == pytest.approx(0.05, abs=0.011)


async def test_the_head_asks_again_at_its_hint_when_nothing_wakes_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = AdmissionQueue(5.0, 8, 1), Room(hint_s=0.4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_ask, queue, room, "w0")
        await trio.sleep(0.1)
        room.free = 1  # freed, and nobody says so
        await trio.sleep(0.2)
        assert room.admitted == []
        await trio.sleep(0.2)
        assert room.admitted == ["w0"]  # at 0.4 s, its hint
    assert queue.statistics().wait_s == pytest.approx(0.4)


async def test_the_wait_is_bounded_in_time_and_in_number(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = AdmissionQueue(1.0, 1, 1), Room(hint_s=0.3)
    started = trio.current_time()
    with pytest.raises(omnitrio.Overloaded) as refused:
        await _ask(queue, room, "w0")
    # Asked again at each hint (0.3, 0.6, 0.9 s); at 0.9 the hint reaches past the
    # wait's end: refused then, with the rule's hint of that moment.
    assert trio.current_time() - started == pytest.approx(0.9)
    assert refused.value.retry_after_s == 0.3
    room.hint_s = 1.5  # a hint beyond the wait: refused at once
    with pytest.raises(omnitrio.Overloaded):
        await _ask(queue, room, "w1")
    assert trio.current_time() - started == pytest.approx(0.9)
    room.hint_s = None  # no estimate: it may wait, as long as the wait allows
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_ask, queue, room, "w2")
        await trio.sleep(0.1)
        assert queue.refuses(room.refusal())  # one waits, and one may
        with pytest.raises(omnitrio.Overloaded):
            await _ask(queue, room, "w3")  # beyond max_waiting: refused at once
        assert trio.current_time() - started == pytest.approx(1.0)
        room.free = 1
        queue.wake()
    assert room.admitted == ["w2"]
    stats = queue.statistics()
    assert (stats.num_admitted, stats.num_refused, stats.num_left) == (1, 1, 0)


async def test_a_waiter_whose_caller_goes_away_leaves_the_queue_and_the_next_is_head(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = AdmissionQueue(30.0, 8, 1), Room()
    async with trio.open_nursery() as nursery:
        gone = trio.CancelScope()

        async def leaving() -> None:
            with gone:
                await _ask(queue, room, "gone")

        nursery.start_soon(leaving)
        await trio.sleep(0.01)
        nursery.start_soon(_ask, queue, room, "w1")
        await trio.sleep(0.01)
        gone.cancel()
        await trio.sleep(0.01)
        assert queue.statistics().num_waiting == 1
        room.free = 1
        queue.wake()  # only the head asks: w1 is it now
    assert room.admitted == ["w1"]
    stats = queue.statistics()
    assert (stats.num_admitted, stats.num_left, stats.num_waiting) == (1, 1, 0)


async def test_quiet_requests_pass_a_head_held_for_its_audio_a_bounded_number_of_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, room = AdmissionQueue(30.0, 16, 8), Room()
    held_only_for_audio = True  # the rule would admit the head but for the startup hold
    quiet: list[str] = []

    def unheld() -> omnitrio.Overloaded | None:
        return None if held_only_for_audio else omnitrio.Overloaded(8, 10.0, "cores")

    async def ask_audio(name: str) -> None:
        await queue.admit(lambda: room.attempt(name), room.refusal, unheld=unheld)

    async def ask_quiet(name: str) -> None:  # the rule admits every quiet one
        await queue.admit(lambda: quiet.append(name), room.refusal, audio=False)

    async with trio.open_nursery() as nursery:
        for name in ("a0", "a1"):
            nursery.start_soon(ask_audio, name)
            await trio.sleep(0.01)
        held_only_for_audio = False  # held by the cores too: a quiet one waits
        nursery.start_soon(ask_quiet, "q0")
        await trio.sleep(0.01)
        assert quiet == []
        held_only_for_audio = True
        queue.wake()  # the waiting quiet one asks, and passes
        await trio.sleep(0.01)
        assert quiet == ["q0"]
        for name in ("q1", "q2", "q3", "q4"):  # newcomers: asked at once
            nursery.start_soon(ask_quiet, name)
            await trio.sleep(0.01)
        assert quiet == ["q0", "q1", "q2", "q3"]  # MAX_PASSES: then first in, first out
        room.free = 1
        nursery.start_soon(ask_audio, "a2")  # an audio newcomer never passes
        await trio.sleep(0.01)
        assert room.admitted == []
        queue.wake()  # a0 is admitted; a1, the new head, may be passed: q4 passes it
        await trio.sleep(0.01)
        assert room.admitted == ["a0"]
        assert quiet == ["q0", "q1", "q2", "q3", "q4"]
        for _ in range(2):
            room.free = 1
            queue.wake()
            await trio.sleep(0.01)
    assert room.admitted == ["a0", "a1", "a2"]
    assert quiet == ["q0", "q1", "q2", "q3", "q4"]
    assert queue.statistics().num_refused == 0


async def test_a_quiet_request_never_passes_a_head_the_rule_admits_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once the hold that kept the head waiting is over (its room is there, nobody has
    told it yet), a quiet newcomer queues behind it rather than taking that room."""
    queue, room = AdmissionQueue(30.0, 16, 8), Room(free=1)
    starting = True  # another answer is on its way to its first audio: the startup hold
    quiet: list[str] = []

    def held() -> omnitrio.Overloaded | None:
        return omnitrio.Overloaded(8, 10.0, "starting") if starting else room.refusal()

    def answer() -> str:
        refusal = held()
        if refusal is not None:
            raise refusal
        return room.attempt("a0")

    def transcription() -> None:
        room.attempt("q")
        quiet.append("q")

    async def ask_quiet() -> None:
        await queue.admit(transcription, room.refusal, audio=False)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(queue.admit, answer, held, unheld=room.refusal))
        await trio.sleep(0.01)
        starting = False  # the other answer played: the head would be admitted now
        nursery.start_soon(ask_quiet)
        await trio.sleep(0.01)
        assert quiet == []  # it did not take the head's room
        queue.wake()
        await trio.sleep(0.01)
        assert room.admitted == ["a0"]
        room.free = 1
        queue.wake()
    assert room.admitted == ["a0", "q"]
    assert queue.statistics().num_refused == 0


async def test_a_full_queue_refuses_no_quiet_newcomer_that_may_pass_its_head(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A quiet request that passes the head is admitted at once and takes no place in
    the queue, so a queue full of answers held by a startup does not refuse it; one the
    rule refuses, or an answer, still is."""
    queue, room = AdmissionQueue(30.0, 2, 8), Room()
    quiet_refusal: omnitrio.Overloaded | None = None  # the rule admits a quiet one
    quiet: list[str] = []

    def transcription(name: str) -> None:
        if quiet_refusal is not None:
            raise quiet_refusal
        quiet.append(name)

    async def ask_audio(name: str) -> None:
        await queue.admit(lambda: room.attempt(name), room.refusal, unheld=lambda: None)

    async with trio.open_nursery() as nursery:
        for name in ("a0", "a1"):  # held only by the startup hold: the queue is full
            nursery.start_soon(ask_audio, name)
            await trio.sleep(0.01)
        assert queue.refuses(room.refusal())  # an answer is refused at once
        assert not queue.refuses(None, audio=False)  # a transcription is not
        await queue.admit(partial(transcription, "q0"), lambda: None, audio=False)
        assert quiet == ["q0"]
        quiet_refusal = omnitrio.Overloaded(8, 10.0, "cores")  # the rule refuses it now
        assert queue.refuses(quiet_refusal, audio=False)
        with pytest.raises(omnitrio.Overloaded):
            await queue.admit(partial(transcription, "q1"), lambda: quiet_refusal, audio=False)
        assert queue.statistics().num_waiting == 2
        for _ in range(2):
            room.free = 1
            queue.wake()
            await trio.sleep(0.01)
    assert room.admitted == ["a0", "a1"]
    assert quiet == ["q0"]


async def test_a_full_queue_refuses_a_quiet_newcomer_once_its_head_has_been_passed_enough(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The bound on passing: with ``max_passes`` 1, the first transcription passes the
    held head of a full queue; the second, which the rule admits too, is refused at once
    with the full queue's refusal (naming ``admission_max_waiting``)."""
    queue, room = AdmissionQueue(30.0, 1, 8, max_passes=1), Room()
    quiet: list[str] = []

    async def ask_audio(name: str) -> None:
        await queue.admit(lambda: room.attempt(name), room.refusal, unheld=lambda: None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask_audio, "a0")  # held only by the startup hold: the queue is full
        await trio.sleep(0.01)
        await queue.admit(partial(quiet.append, "q0"), lambda: None, audio=False)
        assert quiet == ["q0"]
        assert queue.refuses(None, audio=False)  # passed once: the head holds now
        with pytest.raises(omnitrio.Overloaded, match="admission_max_waiting"):
            await queue.admit(partial(quiet.append, "q1"), lambda: None, audio=False)
        assert "admission_max_waiting" in str(queue.full_refusal())
        room.free = 1
        queue.wake()
    assert room.admitted == ["a0"]
    assert quiet == ["q0"]


def _waiting_config(
    admission: str = "max_streams", max_streams: int = 1, **pipeline: Any
) -> omnitrio.PipelineConfig:
    config = chain_config(STAGES, max_streams=max_streams, max_batch_size=8, client_capacity=8)
    update = {"admission": admission, **pipeline}
    return config.model_copy(update={"pipeline": config.pipeline.model_copy(update=update)})


async def _read_all(pipeline: omnitrio.Pipeline, steps: int, got: list[int]) -> None:
    async with pipeline.open_stream(omnitrio.Request("x", options={"steps": steps})) as stream:
        got.append(len([item async for item in stream]))


async def test_a_request_past_max_streams_waits_for_a_slot_and_is_admitted() -> None:
    config = _waiting_config(admission_wait_s=10.0)
    async with omnitrio.open_pipeline(config) as pipeline:
        got: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_all, pipeline, 20, got)
            await trio.lowlevel.checkpoint()
            assert not pipeline.is_full  # full, but a newcomer would wait
            nursery.start_soon(_read_all, pipeline, 5, got)
        stats = pipeline.statistics()
    assert got == [20, 5]
    assert stats.num_refused == 0
    assert stats.admission_waits.num_admitted == 1
    assert stats.admission_waits.wait_s > 0


async def test_a_waiting_request_is_refused_once_its_wait_runs_out_and_leaves_on_cancel() -> None:
    config = _waiting_config(admission_wait_s=0.3)
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream(omnitrio.Request("x", options={"steps": 100_000})):
            started = trio.current_time()
            with pytest.raises(omnitrio.Overloaded):
                async with pipeline.open_stream(omnitrio.Request("y")):
                    pass
            assert trio.current_time() - started >= 0.3
            with trio.move_on_after(0.1):  # its client goes away while it waits
                async with pipeline.open_stream(omnitrio.Request("y")):
                    pass
            waits = pipeline.statistics().admission_waits
            assert (waits.num_refused, waits.num_left, waits.num_waiting) == (1, 1, 0)
        got: list[int] = []
        await _read_all(pipeline, 3, got)  # nothing leaked: the slot is there
        stats = pipeline.statistics()
    assert got == [3]
    assert stats.num_refused == 1  # the one whose wait ran out, not the one that left
    assert stats.admission_waits.num_admitted == 0


async def test_waiters_are_told_when_the_pipeline_closes() -> None:
    config = _waiting_config(admission_wait_s=30.0)
    failures: list[BaseException] = []

    async def opening(pipeline: omnitrio.Pipeline, steps: int) -> None:
        try:
            async with pipeline.open_stream(omnitrio.Request("y", options={"steps": steps})) as s:
                async for _ in s:
                    pass
        except omnitrio.PipelineClosed as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery, omnitrio.open_pipeline(config) as pipeline:
        nursery.start_soon(opening, pipeline, 100_000)  # open until the pipeline closes
        await trio.sleep(0.05)
        nursery.start_soon(opening, pipeline, 3)
        await trio.sleep(0.05)
        assert pipeline.statistics().admission_waits.num_waiting == 1
    assert len(failures) == 2  # the open stream's and the waiter's


async def test_two_requests_arriving_together_the_second_waits_for_the_first_ones_audio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Row 4's clients asking for speech at once, under admission: cpu with a wait: the
    # second of two startups waits until the first one plays, and none is refused.
    monkeypatch.setattr(_rule, "usable_cores", lambda: 64.0)
    config = _waiting_config("cpu", max_streams=8, admission_wait_s=5.0)
    async with omnitrio.open_pipeline(config) as pipeline:
        for _ in range(2):  # two complete: the startup guard has a mean startup
            await _read_all(pipeline, 60, [])
        states: list[Any] = []

        async def one() -> None:
            async with pipeline.open_stream(omnitrio.Request("y", options={"steps": 10})) as s:
                states.append(s._state)
                assert len([item async for item in s]) == 10

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(one)
        stats = pipeline.statistics()
    assert stats.num_refused == 0
    assert stats.admission_waits.num_admitted == 1
    first, second = states
    assert first.first_audio_at_s is not None
    assert second.admitted_at_s >= first.first_audio_at_s


@pytest.mark.parametrize(("max_waiting", "max_passes"), [(16, 4), (1, 4), (16, 0)])
async def test_a_quiet_request_is_admitted_past_an_answer_held_by_a_startup(
    monkeypatch: pytest.MonkeyPatch, max_waiting: int, max_passes: int
) -> None:
    # Under admission: cpu with a wait, an answer that arrives while another is on its
    # way to its first audio waits (the startup hold); a transcription that arrives
    # behind it plays no audio, the rule admits it: it no longer waits for that startup,
    # even where the held answer fills the queue (max_waiting 1: the look lets it
    # through, and an answer is refused at once). An answer that arrives after it
    # still waits behind the held one. With admission_max_passes 0 none passes: the
    # transcription waits its turn.
    monkeypatch.setattr(_rule, "usable_cores", lambda: 64.0)
    stages = [{**STAGES[0], "prefill_ms": 600.0}, STAGES[1]]
    config = chain_config(stages, max_streams=8, max_batch_size=8, client_capacity=8)
    update = {
        "admission": "cpu",
        "admission_wait_s": 5.0,
        "admission_max_waiting": max_waiting,
        "admission_max_passes": max_passes,
    }
    config = config.model_copy(update={"pipeline": config.pipeline.model_copy(update=update)})
    quiet = omnitrio.Request("q", options={"modalities": "text", "steps": 5, "b.visible": "text"})
    async with omnitrio.open_pipeline(config) as pipeline:
        await _read_all(pipeline, 10, [])  # a startup of ~0.6 s learned
        states: dict[str, Any] = {}

        async def one(name: str, request: omnitrio.Request) -> None:
            async with pipeline.open_stream(request) as stream:
                states[name] = stream._state
                async for _ in stream:
                    pass

        answer = omnitrio.Request("y", options={"steps": 10})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "starting", answer)
            await trio.sleep(0.05)  # admitted, in its prefill
            nursery.start_soon(one, "held", answer)
            await trio.sleep(0.05)
            assert pipeline.statistics().admission_waits.num_waiting == 1
            assert pipeline.refuses(answer) == (max_waiting == 1)
            assert not pipeline.refuses(quiet)
            nursery.start_soon(one, "transcription", quiet)
            await trio.sleep(0.05)
            if max_waiting > 1:
                nursery.start_soon(one, "later", answer)
        stats = pipeline.statistics()
    assert stats.num_refused == 0
    first_audio_s = states["starting"].first_audio_at_s
    passed = states["transcription"].admitted_at_s < first_audio_s
    assert passed == (max_passes > 0)
    assert states["held"].admitted_at_s >= first_audio_s
    if max_waiting > 1:
        assert states["later"].admitted_at_s >= states["held"].admitted_at_s


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("admission_wait_s", -1.0),
        ("admission_wait_s", math.inf),
        ("admission_wait_s", 61.0),
        ("admission_wait_s", "soon"),
        ("admission_max_waiting", 0),
        ("admission_max_passes", -1),
        ("admission_max_passes", "four"),
    ],
)
def test_a_bad_wait_is_a_config_error_naming_the_key(key: str, value: object) -> None:
    raw = {
        "pipeline": {"name": "t", key: value},
        "stages": [{"name": "a", "impl": "stages.synthetic:SyntheticStage"}],
    }
    with pytest.raises(omnitrio.ConfigError) as error:
        omnitrio.parse_config(raw)
    assert f"pipeline.{key}" in str(error.value)
