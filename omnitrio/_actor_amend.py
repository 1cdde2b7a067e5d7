"""A stage actor's amends (on trio): what goes into the round queued behind the running
one while its execution has not started, so that it waits for the running step alone,
not for that one and the queued one:

- a newcomer whose first input has come (a first stage's: the stream itself);
- an open stream the queued round does not step whose next input has come (a playing
  answer's next text at the TTS): the join;
- more input for a stream the queued round already steps, taken into that stream's step
  (up to ``max_inputs_per_step``), or its input's close: the top-up.

``_newcomers.py`` keeps the bookkeeping of whom a full batch leaves out and how long a
newcomer waited; ``_scheduler.displaced`` chooses whom.
"""

from __future__ import annotations

import time
from collections.abc import Set
from functools import partial

from ._actor_base import ActorBase
from ._newcomers import leave_out, leaving, queued_candidate
from ._round import Round
from ._runner import Plan
from ._scheduler import urgency
from ._slot import Event, Phase, Slot
from ._stage import StreamWork


class Amending(ActorBase):
    """The amend half of ``StageActor``'s planning."""

    def _amend(self) -> bool:
        """With two rounds out, the queued round takes, while its execution has not
        started, the newcomers, joiners and top-ups above. In a full batch a newcomer
        takes the place of the least urgent stream not on its first step; an open stream
        only of one less urgent than itself (``displaced``); whoever gives its place
        keeps its inputs on its slot for its next step. True if the queued round
        changed. On Ray the answer comes later (the stage's process holds the round
        meanwhile): a newcomer's wait then counts from that answer, when the stage heard
        of it. A newcomer or joiner is tried once per round; a top-up whenever more input
        has come for a stream in it (what it takes leaves nothing to try again)."""
        queued = self._rounds[-1]
        if queued.started:
            return False
        tried = queued.tried
        firsts = [slot for slot in self._firsts() if slot.id not in tried]
        joiners = [slot for slot in self._joiners(queued) if slot.id not in tried]
        if not (firsts or joiners or self._top_ups(queued)):
            return False
        tried.update(slot.id for slot in firsts)
        tried.update(slot.id for slot in joiners)
        amended = self._placement.amend(partial(self._amended, queued))
        if amended is None:
            return False
        queued.started = not amended
        for slot in firsts:  # not amended: the queued round had started when they came
            self._first_waits.seen(slot)
        return amended

    def _firsts(self) -> list[Slot]:
        """Streams new at the stage whose first input has come, not in a round yet."""
        return [
            slot
            for slot in self._lifecycle.values()
            if slot.phase is Phase.NEW
            and not slot.in_flight
            and (slot.in_link is None or self._has_work(slot))
        ]

    def _joiners(self, queued: Round, left_out: frozenset[str] = frozenset()) -> list[Slot]:
        """Open streams with work that fit and that ``queued`` does not step (nor left out
        just now, nor stepped or opened by a round after it: ``left_out``)."""
        if len(queued.batch) == len(self.slots):
            return []  # it steps every stream (the common case at a busy stage)
        stepped = {slot.id for slot in queued.batch} | left_out
        has_work, fits = self._has_work, self._fits
        return [
            slot
            for sid, slot in self.slots.items()
            if sid not in stepped and slot.steppable and has_work(slot) and fits(slot)
        ]

    def _top_ups(self, queued: Round, later: Set[str] = frozenset()) -> list[int]:
        """Where in ``queued``'s batch a stream's input has more than its step took, with
        room for it in the step (``max_inputs_per_step``), or has closed since; not a
        stream a round after ``queued`` steps (ids ``later``: its new input goes after
        that round's)."""
        limit = self.limits.max_inputs_per_step
        slots = self.slots
        found: list[int] = []
        for index, (slot, work) in enumerate(zip(queued.batch, queued.plan.batch, strict=True)):
            in_link = slot.in_link
            if (
                in_link is None
                or work.input_closed
                or slot.id in later
                or slots.get(slot.id) is not slot
                or slot.stream.ending
            ):
                continue
            if in_link.buffered:
                if limit is None or len(work.inputs) < limit:
                    found.append(index)
            elif in_link.producers_done:
                found.append(index)
        return found

    def _top_up(self, slot: Slot, work: StreamWork) -> StreamWork:
        """``work`` with the inputs that came after it was taken, in order, as many as
        the step has room for, and its input's close if that came too."""
        assert slot.in_link is not None
        limit = self.limits.max_inputs_per_step
        inputs, closed = slot.in_link.take(None if limit is None else limit - len(work.inputs))
        return StreamWork(work.stream_id, (*work.inputs, *inputs), closed)

    def _amended(self, queued: Round) -> Plan | None:
        """The queued round with the top-ups, newcomers and joiners in it (on the trio
        thread, while its execution cannot start); None if there are none by now, or
        ``queued`` is no longer out."""
        rounds = self._rounds
        if not self._serving or self._hang is not None or queued.result is not None:
            return None
        if queued not in rounds:  # Round compares by identity
            return None
        firsts = self._firsts()
        now_s = time.perf_counter()
        for slot in firsts:
            self._first_waits.seen(slot, now_s)
        batch, works = list(queued.batch), list(queued.plan.batch)
        opens = list(queued.opens)
        slots, limit = self.slots, self.spec.max_batch_size
        position = rounds.index(queued)
        running = {s.id for s in rounds[position - 1].batch} if position else set()
        # On Ray the answer to ``hold`` may come after the running round came back and
        # a later one was planned: a stream that round opens or steps neither joins
        # ``queued`` (its new input would be stepped before the inputs it took there, or
        # before it is open), nor tops up its step there (the same), nor leaves it (its
        # inputs would go after that round's).
        later = {s.id for r in list(rounds)[position + 1 :] for s in (*r.batch, *r.opens)}
        left_out: set[str] = set()
        changed = False
        for index in self._top_ups(queued, later):  # before anyone gives its place
            works[index] = self._top_up(batch[index], works[index])
            changed = True
        for slot in firsts:
            if len(batch) >= limit:
                out = leaving(batch, running, later, now_s)
                if out is None:
                    break  # every one is on its first step: the rest wait for the next round
                left_out.add(batch[out].id)
                leave_out(batch.pop(out), works.pop(out), self.limits)
            del self._lifecycle[slot.id]
            slot.on(Event.PLAN_OPEN)
            slot.in_flight += 1
            opens.append(slot)
            changed = True
            if self._fits(slot):
                slots[slot.id] = slots.pop(slot.id)  # the most recently stepped
                batch.append(slot)
                works.append(self._take_work(slot))
        queued.batch = tuple(batch)
        joiners = [
            queued_candidate(s, running) for s in self._joiners(queued, frozenset(left_out | later))
        ]
        for candidate in sorted(joiners, key=partial(urgency, now_s=now_s)):
            if len(batch) >= limit:
                own = urgency(candidate, now_s)
                out = leaving(batch, running, later, now_s)
                if out is None or urgency(queued_candidate(batch[out], running), now_s) <= own:
                    break  # none less urgent than it: it (and the rest) wait their turn
                leave_out(batch.pop(out), works.pop(out), self.limits)
            slot = slots.pop(candidate.stream_id)
            slots[slot.id] = slot  # the most recently stepped
            slot.worked_at_s = now_s
            batch.append(slot)
            works.append(self._take_work(slot))
            changed = True
        if not changed:
            return None
        queued.batch, queued.opens = tuple(batch), tuple(opens)
        queued.plan = Plan(
            queued.plan.closes, tuple((s.id, s.stream.request) for s in opens), tuple(works)
        )
        return queued.plan
