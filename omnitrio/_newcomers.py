"""Newcomers at a stage: how many of its steps a stream's first input waits for, and
the bookkeeping for putting a newcomer into the round queued behind the running one
(the actor's ``_amend``, in ``_actor_amend.py``; the choice of whom it displaces is
``_scheduler.displaced``).
"""

from __future__ import annotations

import time

from ._scheduler import Candidate, displaced
from ._slot import Slot
from ._stage import StepLimits, StreamWork


class FirstWaits:
    """Which of a stage's steps each stream waited for between its first input and its
    first step: the steps that ended after the actor saw that input, its own included.
    Counted from the steps' end times, not from timing: on a thread a newcomer that
    joins the queued round waits for the step running, then takes its own (2)."""

    def __init__(self) -> None:
        self._awaiting: dict[str, Slot] = {}
        self.max_steps = 0
        """The most steps a stream waited (``StageStatistics.max_steps_to_first_step``)."""

    def __bool__(self) -> bool:
        return bool(self._awaiting)

    def seen(self, slot: Slot, now_s: float | None = None) -> None:
        """The actor sees ``slot``'s first input (once): its wait starts."""
        if slot.first_input_s is None:
            slot.first_input_s = time.perf_counter() if now_s is None else now_s
            self._awaiting[slot.id] = slot

    def step_ended(self, ended_s: float, slots: dict[str, Slot]) -> None:
        """A step that ended at ``ended_s`` was applied: each stream waiting since before
        then waited for it; those that have their first step now are done waiting, and
        so are those the stage let go of (``slots``: the streams it serves)."""
        awaiting = self._awaiting
        for sid, slot in list(awaiting.items()):
            assert slot.first_input_s is not None
            if ended_s > slot.first_input_s:
                slot.steps_to_first += 1
            if slot.num_steps:
                self.max_steps = max(self.max_steps, slot.steps_to_first)
            if slot.num_steps or slots.get(sid) is not slot:
                del awaiting[sid]


def queued_candidate(slot: Slot, running: set[str]) -> Candidate:
    """A slot of the queued round's batch as the scheduler sees it: on its first step if
    it has had none and the running round (stream ids ``running``) does not step it."""
    first = not slot.num_steps and slot.id not in running
    return Candidate(slot.id, True, True, slot.stream.deadline_s, first)


def leaving(batch: list[Slot], running: set[str], later: set[str], now_s: float) -> int | None:
    """Which member of the queued round's full ``batch`` (its index) gives its place:
    ``displaced``'s choice among those no round after it steps (ids ``later``)."""
    free = [index for index, slot in enumerate(batch) if slot.id not in later]
    out = displaced([queued_candidate(batch[i], running) for i in free], now_s)
    return None if out is None else free[out]


def leave_out(slot: Slot, work: StreamWork, limits: StepLimits) -> None:
    """Take ``slot`` out of a queued round: undo its step's reservations, and keep the
    inputs it had taken on the slot (``Slot.carry``) for its next step."""
    slot.in_flight -= 1
    slot.stream.client.settle(limits.max_visible_per_step, None)
    if slot.out_link is not None:
        slot.out_link.settle(limits.max_payloads_per_step, None)
    slot.carry = work.inputs
