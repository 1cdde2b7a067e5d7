"""A stage actor's planning (on trio): a round's opens, closes and batch (what joins the
round queued behind the running one is ``_actor_amend.py``'s)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from ._actor_base import ActorBase
from ._round import EMPTY_ROUND, Round
from ._runner import Plan
from ._scheduler import Candidate, pick_batch
from ._slot import Event, Phase, Slot


class Planning(ActorBase):
    """The plan half of ``StageActor``."""

    def _plan(self) -> Round | None:
        started = time.perf_counter()
        round_ = self._plan_round()
        self.counters.trio_s += time.perf_counter() - started
        return round_

    def _plan_round(self) -> Round | None:
        """One round's work, or None if there is none. Frees ended streams the stage does
        not hold on the way (that counts as work done: it returns an empty round)."""
        closes, opens, released = self._plan_lifecycle()
        batch = self._plan_batch()
        if not (closes or opens or batch):
            return EMPTY_ROUND if released else None
        plan = Plan(
            tuple(closes),
            tuple((s.id, s.stream.request) for s in opens),
            tuple(self._take_work(slot) for slot in batch),
        )
        return Round(plan, batch, tuple(opens), 0.0)

    def _plan_lifecycle(self) -> tuple[list[str], list[Slot], bool]:
        """Opens for new streams, closes for ended ones the stage holds, and frees the
        ended ones it does not; a slot a round out holds is decided once it is back."""
        closes: list[str] = []
        opens: list[Slot] = []
        released = False
        lifecycle = self._lifecycle
        for sid, slot in list(lifecycle.items()):
            if slot.in_flight:
                continue
            if slot.phase is Phase.NEW and slot.in_link is not None and not self._has_work(slot):
                continue  # opened with its first input
            del lifecycle[sid]
            if slot.phase is Phase.NEW:
                self._first_waits.seen(slot)
                slot.on(Event.PLAN_OPEN)
                slot.in_flight += 1
                opens.append(slot)
            elif slot.phase is Phase.ENDING:
                slot.on(Event.PLAN_CLOSE)
                closes.append(sid)
            elif slot.releasable:
                self._release(slot, Event.RELEASE)
                released = True
        return closes, opens, released

    def _end_empty(self) -> bool:
        """At a stage that ``ends_without_input``, streams whose input ended before any
        item came (never opened, nothing buffered) end here at once, on trio: the next
        stage and the client hear of it without waiting for a round (two may be out, each
        a long step). Nothing was put for them, so no order or credit is at stake. True
        if any ended."""
        ended: list[Slot] = []
        for slot in self._lifecycle.values():
            in_link = slot.in_link
            if (
                slot.phase is Phase.NEW
                and not slot.in_flight
                and in_link is not None
                and in_link.producers_done
                and not in_link.buffered
                and not slot.stream.ending
            ):
                ended.append(slot)
        for slot in ended:
            slot.on(Event.ENDED_EMPTY)
            if slot.out_link is not None:
                slot.out_link.producer_done(wake=False)
            slot.stream.client.producer_done()
            self._release(slot, Event.RELEASE)
        if any(slot.out_link is not None for slot in ended) and self.downstream is not None:
            self.downstream.offer()
        return bool(ended)

    def _plan_batch(self) -> tuple[Slot, ...]:
        """The streams to step, by ``pick_batch``; stepped streams, and ready ones left
        out for want of credit, go to the back of ``slots`` (least recently stepped
        first), and the latter leave the actor's wake-up on the channel that is short.
        One pass over the streams: when every ready stream fits in the batch (the
        usual case), it is the batch without a decision to make."""
        now_s = time.perf_counter()
        slots = self.slots
        if self.scheduling == "deadline":
            ready, skipped = self._ready(now_s)
            if len(ready) > self.spec.max_batch_size:
                decision = pick_batch(
                    (
                        Candidate(s.id, True, True, s.stream.deadline_s, not s.num_steps)
                        for s in ready
                    ),
                    self.spec.max_batch_size,
                    self.scheduling,
                    now_s,
                )
                ready = [slots[sid] for sid in decision.batch]
        else:
            decision = pick_batch(
                self._candidates(now_s), self.spec.max_batch_size, self.scheduling, now_s
            )
            ready = [slots[sid] for sid in decision.batch]
            skipped = [slots[sid] for sid in decision.skipped]
        self._skipped = bool(skipped)
        if skipped:
            self.counters.num_skipped_no_credit += len(skipped)
            for slot in skipped:
                sid = slot.id
                slots[sid] = slots.pop(sid)
                if not slot.in_flight:
                    self._wait_for_credit(slot)
        for slot in ready:
            sid = slot.id
            slots[sid] = slots.pop(sid)
        return tuple(ready)

    def _ready(self, now_s: float) -> tuple[list[Slot], list[Slot]]:
        """Streams with work that fit, and those that do not, least recently planned
        first (``_candidates``' rules, without building a candidate for each)."""
        self.num_behind_now = 0
        ready: list[Slot] = []
        skipped: list[Slot] = []
        has_work, fits = self._has_work, self._fits
        for slot in self.slots.values():
            if not slot.steppable or not has_work(slot):
                continue
            slot.worked_at_s = now_s
            if fits(slot):
                ready.append(slot)
            elif not slot.in_flight:
                skipped.append(slot)
            else:
                continue
            if slot.stream.deadline_s < now_s:
                self.num_behind_now += 1
        self.counters.num_behind_deadline += self.num_behind_now
        return ready, skipped

    def _candidates(self, now_s: float) -> Iterator[Candidate]:
        """Streams with work, least recently planned first (``slots`` is kept in that order),
        read lazily (round robin stops once the batch is full).

        A stream whose last round is still out is planned again on what trio knows
        (the runner skips it if that step said otherwise); one that does not fit a
        second time is left for after its round is back, not counted as skipped.
        """
        self.num_behind_now = 0
        for slot in self.slots.values():
            if not slot.steppable or not self._has_work(slot):
                continue
            slot.worked_at_s = now_s
            fits = self._fits(slot)
            if fits or not slot.in_flight:
                deadline_s = slot.stream.deadline_s
                if deadline_s < now_s:
                    self.num_behind_now += 1
                    self.counters.num_behind_deadline += 1
                yield Candidate(slot.id, True, fits, deadline_s, not slot.num_steps)
