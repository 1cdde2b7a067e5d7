"""A stage's plan of its batch (``_actor_plan.py``): one pass over its streams that takes
every ready stream that fits when the batch holds them all, and asks ``pick_batch`` only
when more are ready; either way the scheduler's decision, its order and its counts."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import outcome
import pytest
import trio

import omnitrio
from omnitrio._actor import StageActor
from omnitrio._link import Link
from omnitrio._round import Round
from omnitrio._scheduler import Candidate, Scheduling, pick_batch
from omnitrio._slot import Phase, Slot
from omnitrio._stage import StepLimits
from omnitrio._stream import DeliveryCounters, StreamHooks, StreamState
from stages.synthetic import Gate
from tests.conftest import SYNTHETIC

LIMITS = StepLimits(max_payloads_per_step=2, max_visible_per_step=1)


def _actor(max_batch_size: int, scheduling: Scheduling) -> StageActor:
    spec = omnitrio.StageSpec(
        name="mid", impl="stages.synthetic:SyntheticStage", max_batch_size=max_batch_size
    )
    actor = StageActor(spec, "up", feeds_edge=True, scheduling=scheduling)
    actor.limits = LIMITS
    return actor


def _slot(rng: random.Random, sid: str, now_s: float) -> Slot:
    """A stream at the stage in a random state: open or not, a round out or not, input
    or not, room downstream and at its client or not, late or not, stepped or not."""
    hooks = StreamHooks(lambda s: None, lambda s: None, DeliveryCounters(), 1.0)
    client = Link("client", 2)
    stream = StreamState(sid, omnitrio.Request("x"), client, {}, frozenset(), hooks)
    stream.deadline_s = now_s + rng.choice((-50.0, -10.0, 10.0, 50.0, 100.0))
    in_link, out_link = Link("up->mid", 8), Link("mid->down", 4)
    slot = Slot(stream, in_link, out_link)
    slot.phase = rng.choice((Phase.OPEN, Phase.OPEN, Phase.OPEN, Phase.NEW))
    slot.in_flight = rng.choice((0, 0, 1))
    slot.num_steps = rng.choice((0, 3))
    if rng.random() < 0.7:
        in_link.reserve(1)
        in_link.put(["payload"], wake=False)
        in_link.settle(1, None)
    if rng.random() < 0.3:  # downstream short of a step's room
        out_link.reserve(3)
    if rng.random() < 0.15:  # its client short of a step's room
        client.reserve(2)
    return slot


def _expected(actor: StageActor, now_s: float) -> tuple[list[str], list[str], int, int]:
    """The scheduler's decision over every stream, as candidates: (batch, skipped, late
    streams, ready streams that fit)."""
    candidates: list[Candidate] = []
    late = 0
    for slot in actor.slots.values():
        if not (slot.steppable and actor._has_work(slot)):
            continue
        fits = actor._fits(slot)
        if fits or not slot.in_flight:
            late += slot.stream.deadline_s < now_s
            candidates.append(
                Candidate(slot.id, True, fits, slot.stream.deadline_s, not slot.num_steps)
            )
    decision = pick_batch(candidates, actor.spec.max_batch_size, actor.scheduling, now_s)
    num_fit = sum(1 for c in candidates if c.fits)
    return list(decision.batch), list(decision.skipped), late, num_fit


@pytest.mark.parametrize("scheduling", ["deadline", "round_robin"])
def test_the_plan_takes_the_schedulers_batch_and_moves_it_to_the_back(
    scheduling: Scheduling,
) -> None:
    rng = random.Random(41)
    paths = {"all fit": 0, "picked": 0}
    for _ in range(400):
        actor = _actor(rng.randint(1, 8), scheduling)
        now_s = time.perf_counter()
        for n in range(rng.randint(0, 12)):
            slot = _slot(rng, f"s{n}", now_s)
            actor.slots[slot.id] = slot
        batch, skipped, late, num_fit = _expected(actor, now_s)
        if num_fit:
            paths["picked" if num_fit > actor.spec.max_batch_size else "all fit"] += 1
        before = [sid for sid in actor.slots if sid not in batch and sid not in skipped]

        planned = actor._plan_batch()

        assert [slot.id for slot in planned] == batch
        assert actor.counters.num_skipped_no_credit == len(skipped)
        assert actor._skipped == bool(skipped)
        # Stepped and skipped streams go to the back, least recently planned first.
        assert list(actor.slots) == before + skipped + batch
        for sid in skipped:
            assert actor.slots[sid].waiting  # its wake-up waits on the short channel
        if scheduling == "deadline":
            assert actor.num_behind_now == late
            assert actor.counters.num_behind_deadline == late
    assert min(paths.values()) > 50  # both ways were taken, many times


def test_a_full_batch_takes_first_steps_then_the_earliest_deadlines() -> None:
    actor = _actor(2, "deadline")
    now_s = time.perf_counter()
    rng = random.Random(0)
    for sid, deadline_s, num_steps in (("far", 90, 3), ("late", -5, 3), ("new", 99, 0)):
        slot = _slot(rng, sid, now_s)
        slot.phase, slot.in_flight, slot.num_steps = Phase.OPEN, 0, num_steps
        slot.in_link, slot.out_link = None, None
        slot.stream.client = Link("client", 2)
        slot.stream.deadline_s = now_s + deadline_s
        actor.slots[sid] = slot
    assert [slot.id for slot in actor._plan_batch()] == ["late", "new"]
    assert list(actor.slots) == ["far", "late", "new"]


# ----- a stage's streams, as its actor sees them --------------------------------------


def _add(actor: StageActor, sid: str, deadline_s: float) -> Slot:
    """A stream at the stage, fed by an upstream edge, playing to ``deadline_s``."""
    hooks = StreamHooks(lambda s: None, lambda s: None, DeliveryCounters(), 1.0)
    stream = StreamState(sid, omnitrio.Request("x"), Link("client", 64), {}, frozenset(), hooks)
    stream.deadline_s = deadline_s
    actor.add(stream, Link("up->mid", 64), None)
    return actor.slots[sid]


def _give(actor: StageActor, slot: Slot, item: object) -> None:
    """Upstream hands ``slot`` one input, as an upstream stage's apply does."""
    assert slot.in_link is not None
    slot.in_link.reserve(1)
    slot.in_link.put([item], wake=False)
    slot.in_link.settle(1, None)
    actor.offer()


def _record_steps(actor: StageActor) -> dict[str, list[object]]:
    """Each stream's inputs as the stage's steps took them, in order: from every round
    applied, its plan as it ran (amended or not), for the streams the stage stepped."""
    taken: dict[str, list[object]] = {}
    apply_round = actor._apply_round

    def recording(round_: Round) -> None:
        if isinstance(round_.result, outcome.Value):
            stepped = set(round_.result.value.stepped)
            for work in round_.plan.batch:
                if work.stream_id in stepped:
                    taken.setdefault(work.stream_id, []).extend(work.inputs)
        apply_round(round_)

    actor._apply_round = recording  # type: ignore[method-assign]
    return taken


async def _queue_behind_gate(
    actor: StageActor, gate: Gate, slot: Slot, running: object, queued: object
) -> Round:
    """``slot``'s input ``running`` in a round held at ``gate`` (closed here), then
    ``queued`` in the round queued behind it: that round."""
    gate.close()
    _give(actor, slot, running)
    assert await trio.to_thread.run_sync(gate.wait_until_blocked, 10.0)
    _give(actor, slot, queued)
    assert len(actor._rounds) == 2
    return actor._rounds[-1]


async def _until(done: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not done():  # noqa: ASYNC110 - the actor's state has no event to wait on
            await trio.sleep(0.001)


# ----- an open stream's new input joins the queued round --------------------------------


@pytest.mark.parametrize(
    ("max_batch_size", "playing_first", "joins"),
    [
        (2, False, True),  # room in the batch: it joins
        (1, True, True),  # full: it takes the place of a less urgent stream
        (1, False, False),  # full, and it is the less urgent: it waits its turn
    ],
)
async def test_an_open_streams_new_input_joins_the_round_queued_behind_the_running_one(
    max_batch_size: int, playing_first: bool, joins: bool
) -> None:
    # A playing answer's next text comes while the stage runs a step (held at a gate)
    # and the next round is queued, planned before the text came: the text goes into
    # that queued round, not the one after it.
    name = f"test-join-queued-{max_batch_size}-{playing_first}"
    gate = Gate.named(name)
    params = {"gate": name, "outputs_per_input": 0, "visible_every": 0}
    spec = omnitrio.StageSpec(
        name="mid", impl=SYNTHETIC, max_batch_size=max_batch_size, params=params
    )
    actor = StageActor(spec, "up", feeds_edge=False)
    await actor.load()
    now_s = time.perf_counter()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.serve)
            await _until(lambda: actor._serving)
            busy = _add(actor, "busy", now_s + 50.0)
            playing = _add(actor, "playing", now_s + (10.0 if playing_first else 90.0))
            for slot in (busy, playing):
                _give(actor, slot, f"{slot.id}-0")
            await _until(lambda: busy.num_steps >= 1 and playing.num_steps >= 1)
            queued = await _queue_behind_gate(actor, gate, busy, "busy-1", "busy-2")
            assert [slot.id for slot in queued.batch] == ["busy"]

            _give(actor, playing, "playing-1")

            assert actor._rounds[-1] is queued
            works = {work.stream_id: work.inputs for work in queued.plan.batch}
            if joins:
                assert works.get("playing") == ("playing-1",)
                assert ("busy" in works) is (max_batch_size > 1)
                if max_batch_size == 1:  # busy keeps its input for its next step
                    assert busy.carry == ("busy-2",)
            else:
                assert works == {"busy": ("busy-2",)}
            gate.open()
            await _until(lambda: playing.num_steps == 2 and busy.num_steps == 3)
            nursery.cancel_scope.cancel()
    finally:
        gate.open()
        await actor.shutdown(5.0)


# ----- more input for a stream in the queued round tops up its step ---------------------


@pytest.mark.parametrize("inputs_per_step", [3, 2])
async def test_more_input_for_a_stream_the_queued_round_steps_goes_into_that_step(
    inputs_per_step: int,
) -> None:
    # A playing answer's text comes while the stage runs a step (held at a gate) and the
    # round queued behind it already steps that answer, with the text that had come: the
    # new text goes into that step, as much as a step takes, then the input's close;
    # what does not fit waits for the round after. Every input is stepped once, in order.
    name = f"test-top-up-{inputs_per_step}"
    gate = Gate.named(name)
    params = {
        "gate": name,
        "inputs_per_step": inputs_per_step,
        "outputs_per_input": 0,
        "visible_every": 0,
    }
    spec = omnitrio.StageSpec(name="mid", impl=SYNTHETIC, max_batch_size=2, params=params)
    actor = StageActor(spec, "up", feeds_edge=False)
    await actor.load()
    taken = _record_steps(actor)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.serve)
            await _until(lambda: actor._serving)
            playing = _add(actor, "playing", time.perf_counter() + 10.0)
            _give(actor, playing, "p-0")
            await _until(lambda: playing.num_steps == 1)
            queued = await _queue_behind_gate(actor, gate, playing, "p-1", "p-2")
            assert [work.inputs for work in queued.plan.batch] == [("p-2",)]

            _give(actor, playing, "p-3")
            _give(actor, playing, "p-4")
            assert playing.in_link is not None
            playing.in_link.producer_done(wake=False)  # upstream is through with it
            actor.offer()

            assert actor._rounds[-1] is queued
            (work,) = queued.plan.batch
            assert work.inputs == ("p-2", "p-3", "p-4")[:inputs_per_step]
            assert work.input_closed is (inputs_per_step == 3)  # p-4 waits: not closed yet
            gate.open()
            await _until(lambda: "playing" not in actor.slots)
            nursery.cancel_scope.cancel()
    finally:
        gate.open()
        await actor.shutdown(5.0)
    assert taken == {"playing": [f"p-{n}" for n in range(5)]}
    assert playing.num_steps == (3 if inputs_per_step == 3 else 4)
