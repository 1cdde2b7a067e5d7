"""A stream's wait for its first step at a stage, counted in the stage's steps."""

from __future__ import annotations

import omnitrio
from omnitrio._link import Link
from omnitrio._newcomers import FirstWaits, leave_out
from omnitrio._slot import Slot
from omnitrio._stage import StepLimits, StreamWork
from omnitrio._stream import DeliveryCounters, StreamHooks, StreamState


def _slot(sid: str) -> Slot:
    hooks = StreamHooks(lambda s: None, lambda s: None, DeliveryCounters(), 1.0)
    stream = StreamState(sid, omnitrio.Request("x"), Link("client", 4), {}, frozenset(), hooks)
    return Slot(stream, Link("a->b", 8), None)


def test_a_first_input_waits_for_the_steps_that_end_after_it_its_own_included() -> None:
    waits = FirstWaits()
    quick = _slot("quick")
    slots = {"quick": quick}
    waits.seen(quick, now_s=10.0)
    waits.seen(quick, now_s=11.0)  # seen once: the first sighting counts
    waits.step_ended(9.5, slots)  # ended before its input came: not waited for
    waits.step_ended(10.2, slots)  # the step running when it came
    assert (bool(waits), waits.max_steps) == (True, 0)
    quick.num_steps = 1  # its own step, applied
    waits.step_ended(10.4, slots)
    assert (bool(waits), waits.max_steps) == (False, 2)
    # A stream that goes before its first step is no longer waited on.
    gone = _slot("gone")
    waits.seen(gone, now_s=20.0)
    waits.step_ended(21.0, {})
    assert (bool(waits), waits.max_steps) == (False, 2)


def test_a_stream_left_out_keeps_its_inputs_and_gives_back_its_credit() -> None:
    slot = _slot("late")
    limits = StepLimits(max_payloads_per_step=0, max_visible_per_step=2)
    slot.stream.client.reserve(2)
    slot.in_flight = 1
    leave_out(slot, StreamWork("late", ("p1", "p2"), False), limits)
    assert slot.carry == ("p1", "p2")
    assert slot.in_flight == 0
    assert slot.stream.client.free == 4
