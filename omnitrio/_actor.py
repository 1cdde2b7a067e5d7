"""A stage actor: one trio task plus the place its stage executes (a dedicated
worker thread, or a Ray actor: ``_placement.py``).

The task decides, the thread executes. Each *round* is::

    plan     (trio)    free ended streams, pick a batch of ready streams that fit,
                       reserve their credit, take their inputs
    execute  (thread)  close/open per-stream state, stage.step(batch), close finished
                       (in a Ray actor's process with ``placement: ray``)
    apply    (trio)    hand payloads to the next stage (which plans at once), then
                       visible items to clients; fail streams whose work failed

Up to two rounds are out at once: while the thread runs round N, round N+1 is
already planned, its credit reserved, and queued behind it, so the thread goes
from one step to the next without waiting for trio. A newcomer whose first input
comes meanwhile joins round N+1 while the thread has not started it (``_amend``),
so it waits for the running step alone, not for two. One crossing into the
thread and one back per round, whatever the batch size. Planning starts in one
place, ``_advance`` (apply the rounds that came back, then plan while fewer than
two are out), called where a round's result lands, where upstream offers work,
and from the task when its ``Wakeup`` fires (an input, credit it was short of, a
new or ended stream): no polling, no timeouts but the watchdog's.

Each stream's life at the stage is a ``Slot`` state machine (``_slot.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

import outcome
import trio

from ._config import StageSpec
from ._contract import ProtocolError
from ._errors import StageCall, StageError
from ._items import AudioChunk
from ._link import Link, Wakeup
from ._newcomers import FirstWaits, leave_out, queued_candidate
from ._placement import StageLost, place
from ._runner import Plan, Result
from ._scheduler import Candidate, Scheduling, displaced, pick_batch
from ._slot import HOLDING, Event, Phase, Slot
from ._stage import StepLimits, StreamOutput, StreamWork
from ._statistics import StageStatistics
from ._stream import StreamState
from .admission import ACTIVE_WINDOW_S, StepModel

logger = logging.getLogger(__name__)

MAX_ROUNDS_OUT = 2
"""The running round and the next one, planned and queued behind it."""


@dataclass(eq=False, slots=True)
class _Round:
    """A plan handed to the thread, and what it holds, until its result is applied."""

    plan: Plan
    batch: tuple[Slot, ...]  # the slots of plan.batch, in order (their credit is reserved)
    opens: tuple[Slot, ...]
    since: float  # trio time it became the oldest round out (the watchdog's start)
    result: outcome.Outcome[Result] | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.plan.closes or self.opens or self.batch)


_EMPTY_ROUND = _Round(Plan((), (), ()), (), (), 0.0)
_LIVE = frozenset({Phase.NEW, Phase.OPENING, Phase.OPEN})


@dataclass
class _Counters:
    num_steps: int = 0
    num_batched: int = 0
    largest_batch_size: int = 0
    last_batch_size: int = 0
    num_skipped_no_credit: int = 0
    num_payloads_sent: int = 0
    num_visible_sent: int = 0
    num_stream_failures: int = 0
    num_step_failures: int = 0
    num_empty_plans: int = 0
    num_behind_deadline: int = 0
    busy_s: float = 0.0
    trio_s: float = 0.0
    idle_s: float = 0.0


@dataclass
class _Hang:
    """The stage is out of service: a step outlived ``step_timeout_s``."""

    round: _Round
    problem: str
    closes: list[str] = field(default_factory=list)


class StageActor:
    """Runs one configured stage. Made by the supervisor in ``open_pipeline``.

    ``feeds_edge`` is False for the last stage of the chain and for a side stage;
    ``payloads_by_reference``: this stage and the next are both on Ray.
    ``on_round``: called after each applied round that stepped (the supervisor's
    overload check).
    """

    def __init__(
        self,
        spec: StageSpec,
        source: str,
        *,
        feeds_edge: bool,
        payloads_by_reference: bool = False,
        scheduling: Scheduling = "deadline",
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.scheduling: Scheduling = scheduling
        self.wakeup = Wakeup()
        self.counters = _Counters()
        self.slots: dict[str, Slot] = {}
        self.step_model = StepModel(spec.max_batch_size)
        self.downstream: StageActor | None = None
        self.on_round: Callable[[StageActor], None] | None = None
        self._placement = place(
            spec, source, feeds_edge=feeds_edge, payloads_by_reference=payloads_by_reference
        )
        self._loading = False  # load() was called: shutdown closes what it made
        self._rounds: deque[_Round] = deque()
        self._lifecycle: dict[str, Slot] = {}  # slots in NEW or ENDING: planning acts on them
        self._first_waits = FirstWaits()
        self._hang: _Hang | None = None
        self._serving = False
        self._waiting: trio.CancelScope | None = None  # the loop's wait, while it waits
        self._idle_since: float | None = None  # when the last round out came back
        self._skipped = False  # the last plan left a stream out for want of credit
        self.num_behind_now = 0
        """Ready streams the latest plan saw past their playback deadline."""
        self.limits = StepLimits(0, 0)  # the runner's, once loaded

    @property
    def hung(self) -> bool:
        """Out of service: a step outlived ``step_timeout_s``, or the stage's Ray actor
        is being restarted."""
        return self._hang is not None or self._placement.restarting

    # ----- lifecycle ----------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def statistics(
        self, audio_s_delivered: float = 0.0, cap: int = 0, factor: float = 1.0
    ) -> StageStatistics:
        """A frozen snapshot of this stage (``factor``: the realtime factor its model's
        ``realtime_streams`` counts at). Cheap; never blocks."""
        c = self.counters
        return StageStatistics(
            name=self.name,
            num_open_streams=len(self.slots),
            queue_depth=MappingProxyType(
                {
                    sid: (s.in_link.buffered if s.in_link else 0) + len(s.carry)
                    for sid, s in self.slots.items()
                }
            ),
            num_steps=c.num_steps,
            last_batch_size=c.last_batch_size,
            largest_batch_size=c.largest_batch_size,
            mean_batch_size=c.num_batched / c.num_steps if c.num_steps else 0.0,
            num_skipped_no_credit=c.num_skipped_no_credit,
            num_payloads_sent=c.num_payloads_sent,
            num_visible_sent=c.num_visible_sent,
            num_stream_failures=c.num_stream_failures,
            num_step_failures=c.num_step_failures,
            num_empty_plans=c.num_empty_plans,
            busy_s=c.busy_s,
            trio_s=c.trio_s,
            idle_s=c.idle_s,
            hung=self.hung,
            model=MappingProxyType(self._placement.model_statistics()),
            num_payload_bytes_relayed=self._placement.num_payload_bytes_relayed,
            pid=self._placement.pid,
            step_model=self.step_model.statistics(audio_s_delivered, cap, factor),
            num_behind_deadline=c.num_behind_deadline,
            max_steps_to_first_step=self._first_waits.max_steps,
            num_active_streams=len(self.active_streams(time.perf_counter(), ACTIVE_WINDOW_S)),
        )

    async def load(self) -> StepLimits:
        """Start the stage's thread (or Ray actor) and load the stage; returns its limits."""
        self._loading = True
        started = time.perf_counter()
        logger.info(
            "loading stage %r (%s) on a %s",
            self.name,
            self.spec.impl,
            self.spec.placement,
            extra={"stage": self.name},
        )
        limits = await self._placement.load()
        logger.info(
            "stage %r ready in %.2f s",
            self.name,
            time.perf_counter() - started,
            extra={"stage": self.name},
        )
        self.limits = limits
        return limits

    async def serve(self) -> None:
        """Serve until cancelled (then ``shutdown``, shielded and bounded, is the caller's)."""
        try:
            self._serving = True
            await self._serve()
        finally:
            self._serving = False

    async def shutdown(self, timeout_s: float) -> None:
        """Close what the stage holds, close the stage, join its thread or remove its
        Ray actor (bounded by ``timeout_s``, shielded)."""
        self._serving = False
        if not self._loading:
            return
        self._loading = False
        if not await self._placement.close(trio.current_time() + timeout_s):
            logger.error(
                "stage %r did not finish its step within %.1f s of shutdown; streams in flight: %s",
                self.name,
                timeout_s,
                ", ".join(self.slots) or "none",
                extra={"stage": self.name},
            )
        for slot in list(self.slots.values()):
            self._release(slot, Event.ABANDON)

    # ----- streams coming and going -------------------------------------------------

    def add(self, stream: StreamState, in_link: Link | None, out_link: Link | None) -> None:
        """A new stream: its state is opened on the stage in the next round (the first
        stage's), or in the round that takes its first input (a later stage's: no round,
        and no wake-up of its thread, while the first stage takes the stream's first
        step, the first-audio path). The first stage plans once the admitting task
        yields, not from here: a burst of admissions then shares one round (one
        batched prefill) instead of the first one or two going out alone."""
        slot = Slot(stream, in_link, out_link, worked_at_s=time.perf_counter())
        self.slots[stream.id] = slot
        self._lifecycle[stream.id] = slot
        if in_link is None:
            self.wakeup.set()

    def drop(self, stream_id: str) -> None:
        """The stream ended (failed or cancelled): free it in the next round."""
        slot = self.slots.get(stream_id)
        if slot is None:
            return
        if slot.on(Event.END) in (Phase.CLOSED, Phase.ENDING):
            self._lifecycle[stream_id] = slot
        self.wakeup.set()

    def active_streams(self, now_s: float, window_s: float) -> list[StreamState]:
        """The live streams in a round out, or with work here within ``window_s`` of
        ``now_s`` (or added that recently): those a round steps (admission's and
        shedding's count; a stream the stage holds idle is not among them)."""
        since_s = now_s - window_s
        return [
            slot.stream
            for slot in self.slots.values()
            if slot.phase in _LIVE
            and not slot.stream.ending
            and (slot.in_flight or slot.worked_at_s >= since_s)
        ]

    def offer(self) -> None:
        """Upstream just put payloads on this stage's incoming edges: plan now, from
        upstream's apply, so the work is queued before upstream delivers to clients."""
        if self._serving and self._hang is None:
            self._advance()
        else:
            self.wakeup.set()

    # ----- the loop -----------------------------------------------------------------

    async def _serve(self) -> None:
        """The task's part: advance on wake-ups, and the watchdog. A finished round is
        applied where its result lands (``_round_done``), without waking the task."""
        self._idle_since = time.perf_counter()
        woken = False
        while True:
            acted = self._advance()
            if woken and not acted and not self._skipped and len(self._rounds) < MAX_ROUNDS_OUT:
                # Woken, and no stream had work (a stream that lost the credit it was
                # woken for to another stage is counted in num_skipped_no_credit).
                self.counters.num_empty_plans += 1
            with trio.CancelScope(deadline=self._watchdog_deadline()) as self._waiting:
                woken = await self.wakeup.wait()
            self._waiting = None
            if self._rounds and trio.current_time() >= self._watchdog_deadline():
                self._hung(self._rounds[0])
                woken = False

    def _round_done(self, round_: _Round, value: outcome.Outcome[Result]) -> None:
        """A round's result is back on the trio thread (``run_sync_soon``): apply it and
        plan the next round right here, one task switch earlier than the actor's task
        could. Never raises (this runs in trio's own callback task)."""
        round_.result = value
        if not self._serving:
            return  # shutting down: the final job closes what the stage holds
        try:
            self._advance()
            if self._waiting is not None:
                self._waiting.deadline = self._watchdog_deadline()
        except Exception:
            logger.exception("stage %r: applying a round failed", self.name)
            self.wakeup.set()

    def _advance(self) -> bool:
        """Where all planning starts: apply the rounds that came back, in order, then
        plan and submit rounds while fewer than two are out. True if it did anything."""
        acted = self._apply_finished()
        self.wakeup.consume()  # this plan sees everything a pending wake-up was for
        if self._hang is not None:
            self._fail_all()
            return True
        while len(self._rounds) < MAX_ROUNDS_OUT:
            round_ = self._plan()
            if round_ is None:
                return acted
            acted = True
            if round_.has_work:
                self._submit(round_)
        if self._lifecycle and self.scheduling == "deadline":
            started = time.perf_counter()
            acted |= self._amend()
            self.counters.trio_s += time.perf_counter() - started
        return acted

    def _apply_finished(self) -> bool:
        """Apply the finished rounds at the head, in order. True if there were any."""
        rounds = self._rounds
        applied = False
        while rounds and rounds[0].result is not None:
            self._apply(rounds.popleft())
            applied = True
            if rounds:
                rounds[0].since = trio.current_time()
            else:
                self._idle_since = time.perf_counter()
        return applied

    def _watchdog_deadline(self) -> float:
        """When the oldest round out has run for ``step_timeout_s`` (inf if none, or hung)."""
        timeout_s = self.spec.step_timeout_s
        if not self._rounds or timeout_s is None or self._hang is not None:
            return math.inf
        return self._rounds[0].since + timeout_s

    def _submit(self, round_: _Round) -> None:
        first = not self._rounds
        self._rounds.append(round_)
        if first:
            round_.since = trio.current_time()
            if self._idle_since is not None:
                self.counters.idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None
            if self._waiting is not None:  # submitted from outside the task: arm the watchdog
                self._waiting.deadline = self._watchdog_deadline()
        self._placement.submit(round_.plan, partial(self._round_done, round_))

    def _hung(self, round_: _Round) -> None:
        """The oldest round did not return within ``step_timeout_s``. A thread cannot be
        interrupted, so the stage is out of service until it does: its streams fail
        with a ``StageError`` naming it, streams that arrive meanwhile fail at once,
        and the rest of the pipeline serves on. When the step returns, the stage
        serves again (the streams it failed stay failed)."""
        in_flight = [w.stream_id for w in round_.plan.batch] + [sid for sid, _ in round_.plan.opens]
        logger.error(
            "stage %r is hung: a step has not returned for %.1f s; streams in flight: %s",
            self.name,
            self.spec.step_timeout_s,
            ", ".join(in_flight) or "none",
            extra={"stage": self.name},
        )
        problem = f"step did not return within step_timeout_s={self.spec.step_timeout_s}"
        self._hang = _Hang(round_, problem)
        self._fail_all()

    def _fail_all(self) -> None:
        hang = self._hang
        assert hang is not None
        for slot in list(self.slots.values()):
            self._fail(slot.id, "watchdog", TimeoutError(hang.problem), "watchdog")
            if slot.phase in HOLDING or slot.in_flight:
                hang.closes.append(slot.id)  # closed on the stage once it is back
            self._release(slot, Event.ABANDON)

    # ----- plan (trio) --------------------------------------------------------------

    def _plan(self) -> _Round | None:
        started = time.perf_counter()
        round_ = self._plan_round()
        self.counters.trio_s += time.perf_counter() - started
        return round_

    def _plan_round(self) -> _Round | None:
        """One round's work, or None if there is none. Frees ended streams the stage does
        not hold on the way (that counts as work done: it returns an empty round)."""
        closes, opens, released = self._plan_lifecycle()
        batch = self._plan_batch()
        if not (closes or opens or batch):
            return _EMPTY_ROUND if released else None
        plan = Plan(
            tuple(closes),
            tuple((s.id, s.stream.request) for s in opens),
            tuple(self._take_work(slot) for slot in batch),
        )
        return _Round(plan, batch, tuple(opens), 0.0)

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

    def _plan_batch(self) -> tuple[Slot, ...]:
        """The streams to step, by ``pick_batch``; stepped streams, and ready ones left
        out for want of credit, go to the back of ``slots`` (least recently stepped
        first), and the latter leave the actor's wake-up on the channel that is short."""
        now_s = time.perf_counter()
        decision = pick_batch(
            self._candidates(now_s), self.spec.max_batch_size, self.scheduling, now_s
        )
        slots = self.slots
        self._skipped = bool(decision.skipped)
        if decision.skipped:
            self.counters.num_skipped_no_credit += len(decision.skipped)
            for sid in decision.skipped:
                slot = slots[sid] = slots.pop(sid)
                if not slot.in_flight:
                    self._wait_for_credit(slot)
        picked: list[Slot] = []
        for sid in decision.batch:
            slot = slots[sid] = slots.pop(sid)
            picked.append(slot)
        return tuple(picked)

    def _candidates(self, now_s: float) -> Iterator[Candidate]:
        """Streams with work, least recently planned first (``slots`` is kept in that order).

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

    @staticmethod
    def _has_work(slot: Slot) -> bool:
        """New input, input that just closed, or the stage asked for more."""
        in_link = slot.in_link
        if slot.more or slot.carry or (in_link is not None and in_link.buffered > 0):
            return True
        return (in_link is None or in_link.producers_done) and not slot.told_closed

    def _fits(self, slot: Slot) -> bool:
        """Room for a whole step's output on every channel the stream writes to."""
        limits = self.limits
        if slot.stream.client.free < limits.max_visible_per_step:
            return False
        out_link = slot.out_link
        return out_link is None or out_link.free >= limits.max_payloads_per_step

    def _wait_for_credit(self, slot: Slot) -> None:
        """Leave the actor's wake-up on the channel a skipped stream is short of (only
        credit coming back there wakes it)."""
        limits = self.limits
        client, out_link = slot.stream.client, slot.out_link
        if client.free < limits.max_visible_per_step:
            client.wait_for_credit(self.wakeup, limits.max_visible_per_step)
        elif out_link is not None:
            out_link.wait_for_credit(self.wakeup, limits.max_payloads_per_step)
        slot.waiting = True

    def _take_work(self, slot: Slot) -> StreamWork:
        limits = self.limits
        slot.in_flight += 1
        client, out_link = slot.stream.client, slot.out_link
        client.reserve(limits.max_visible_per_step)
        if slot.waiting:  # it fits now: a wake-up for its credit would find nothing to do
            slot.waiting = False
            client.stop_waiting(self.wakeup)
            if out_link is not None:
                out_link.stop_waiting(self.wakeup)
        if out_link is not None:
            out_link.reserve(limits.max_payloads_per_step)
        if slot.in_link is None:
            return StreamWork(slot.id, (), True)
        limit, carry = limits.max_inputs_per_step, slot.carry
        if carry:  # inputs it was left out of a step with go first
            slot.carry = ()
            limit = None if limit is None else limit - len(carry)
        inputs, closed = slot.in_link.take(limit)
        return StreamWork(slot.id, (*carry, *inputs), closed)

    # ----- a newcomer into the queued round -----------------------------------------

    def _amend(self) -> bool:
        """With two rounds out, newcomers whose first input has come (a first stage's: the
        stream itself) join the queued round if its execution has not started (thread
        placement): a first step is the most urgent there is. In a full batch a newcomer
        takes the place of the least urgent stream not on its first step, whose inputs
        wait on its slot for its next step. True if the queued round changed."""
        firsts = [
            slot
            for slot in self._lifecycle.values()
            if slot.phase is Phase.NEW
            and not slot.in_flight
            and (slot.in_link is None or self._has_work(slot))
        ]
        if not firsts:
            return False
        amended = self._placement.amend(partial(self._amended, self._rounds[-1], firsts))
        for slot in firsts:  # not amended: the queued round had started when they came
            self._first_waits.seen(slot)
        return amended

    def _amended(self, queued: _Round, firsts: list[Slot]) -> Plan:
        """The queued round with ``firsts`` in it (on the trio thread, while the worker
        cannot start it)."""
        now_s = time.perf_counter()
        for slot in firsts:
            self._first_waits.seen(slot, now_s)
        batch, works = list(queued.batch), list(queued.plan.batch)
        opens = list(queued.opens)
        slots = self.slots
        running = {s.id for s in self._rounds[0].batch}
        for slot in firsts:
            if len(batch) >= self.spec.max_batch_size:
                out = displaced([queued_candidate(s, running) for s in batch], now_s)
                if out is None:
                    break  # every one is on its first step: the rest wait for the next round
                leave_out(batch.pop(out), works.pop(out), self.limits)
            del self._lifecycle[slot.id]
            slot.on(Event.PLAN_OPEN)
            slot.in_flight += 1
            opens.append(slot)
            if self._fits(slot):
                slots[slot.id] = slots.pop(slot.id)  # the most recently stepped
                batch.append(slot)
                works.append(self._take_work(slot))
        queued.batch, queued.opens = tuple(batch), tuple(opens)
        queued.plan = Plan(
            queued.plan.closes, tuple((s.id, s.stream.request) for s in opens), tuple(works)
        )
        return queued.plan

    # ----- apply (back in trio) -----------------------------------------------------

    def _apply(self, round_: _Round) -> None:
        started = time.perf_counter()
        self._apply_round(round_)
        self.counters.trio_s += time.perf_counter() - started
        if round_.plan.batch and self.on_round is not None:
            self.on_round(self)

    def _apply_round(self, round_: _Round) -> None:
        """A round's result, in the order it matters: what the stage opened, the step's
        outputs onto the edges (downstream plans at once), then onto clients, then
        what the stage closed; the step-time model and the first-input count learn
        from it after that, off the path to the next stage and the client."""
        result = self._unwrap(round_)
        num_first = self._count_step(result)
        self._settle_opens(round_, result)
        delivered = self._route_outputs(round_, result)
        self._deliver_visible(delivered)
        self._settle_closes(round_, result)
        if num_first is not None:
            self.step_model.observe(len(result.stepped), result.step_s, num_first)
        if self._first_waits and result.stepped:
            self._first_waits.step_ended(result.step_ended_s, self.slots)

    def _unwrap(self, round_: _Round) -> Result:
        try:
            result = round_.result.unwrap() if round_.result is not None else Result()
        except StageLost as lost:
            result = self._lost(lost)
        except Exception as broken:  # the runner itself broke: a runtime bug, loud
            logger.exception("stage %r: a round failed outside the stage", self.name)
            stepped = [w.stream_id for w in round_.plan.batch]
            result = Result(stepped=stepped, step_error=broken)
        if self._hang is not None and self._hang.round is round_:
            self._recover()
        self._report_step_problems(result)
        return result

    def _count_step(self, result: Result) -> int | None:
        """Count the round; returns how many of its streams took their first step here,
        for the step-time model (None: nothing for it to learn)."""
        counters = self.counters
        counters.busy_s += result.busy_s
        size = len(result.stepped)
        if size:
            counters.num_steps += 1
            counters.num_batched += size
            counters.last_batch_size = size
            counters.largest_batch_size = max(counters.largest_batch_size, size)
            if result.step_error is None:
                slots = self.slots
                return sum(1 for sid in result.stepped if sid in slots and not slots[sid].num_steps)
        return None

    def _settle_opens(self, round_: _Round, result: Result) -> None:
        for slot in round_.opens:
            slot.in_flight -= 1
        opened = set(result.opened)
        for slot in round_.opens:
            if self.slots.get(slot.id) is slot and slot.phase in (Phase.OPENING, Phase.ENDING):
                slot.on(Event.OPENED if slot.id in opened else Event.OPEN_FAILED)
        for sid, exc in result.errors.items():
            self._fail(sid, "open_stream", exc, "open_stream")

    def _route_outputs(
        self, round_: _Round, result: Result
    ) -> list[tuple[Slot, StreamWork, StreamOutput]]:
        """Each stepped stream's payloads onto its outgoing edge, its credit settled; the
        next stage is offered the work once, after the whole batch. The hot loop:
        O(batch), a handful of attribute reads per stream."""
        plan = round_.plan
        stepped = result.stepped
        in_step = None if len(stepped) == len(plan.batch) else set(stepped)
        outputs, step_error = result.outputs, result.step_error
        slots = self.slots
        max_payloads = self.limits.max_payloads_per_step
        max_visible = self.limits.max_visible_per_step
        delivered: list[tuple[Slot, StreamWork, StreamOutput]] = []
        routed = False
        for slot, work in zip(round_.batch, plan.batch, strict=True):
            slot.in_flight -= 1
            sid = work.stream_id
            out_link = slot.out_link
            if (
                (in_step is None or sid in in_step)
                and slots.get(sid) is slot
                and not slot.stream.ending
            ):
                if step_error is not None:
                    self._fail(sid, "step", step_error)
                else:
                    output = outputs[sid]
                    if output.error is not None:
                        self._fail(sid, "step", output.error)
                    else:
                        slot.num_steps += 1
                        self.step_model.stepped(slot.flow, slot.num_steps, slot.stream.audio_s)
                        delivered.append((slot, work, output))
                        routed |= out_link is not None
                        self._route(slot, work, output)
                        if out_link is not None:
                            out_link.settle(max_payloads, None)
                        continue
            # Not delivered: nothing will use this stream's reservations.
            slot.stream.client.settle(max_visible, 0)
            if out_link is not None:
                out_link.settle(max_payloads, None)
        # Downstream work is queued before any client hears of this step.
        if routed and self.downstream is not None:
            self.downstream.offer()
        return delivered

    def _route(self, slot: Slot, work: StreamWork, output: StreamOutput) -> None:
        """An output's payloads onto the outgoing edge, and what the stage said about the
        stream (the forecast of the runner's record)."""
        out_link = slot.out_link
        if out_link is not None:
            if output.payloads:
                out_link.put(output.payloads, wake=False)
                self.counters.num_payloads_sent += len(output.payloads)
            if output.done:
                out_link.producer_done(wake=False)
        slot.more = output.more
        slot.told_closed |= work.input_closed

    def _deliver_visible(self, delivered: list[tuple[Slot, StreamWork, StreamOutput]]) -> None:
        """Visible items onto clients' links (audio moves the stream's playback deadline);
        unused client credit goes back, and a stage short of it hears of it."""
        max_visible = self.limits.max_visible_per_step
        num_visible = 0
        now_s = time.perf_counter()
        for slot, work, output in delivered:
            visible = output.visible
            stream = slot.stream
            client = stream.client
            if visible:
                client.put(visible)
                num_visible += len(visible)
                for item in visible:
                    if type(item) is AudioChunk:
                        stream.put_audio(item.duration_s, now_s)
            client.settle(max_visible, len(visible))
            if output.done:
                client.producer_done()
            elif work.input_closed and not output.more:
                problem = ProtocolError("neither more nor done after input closed")
                self._fail(work.stream_id, "step", problem)
        self.counters.num_visible_sent += num_visible

    def _settle_closes(self, round_: _Round, result: Result) -> None:
        """Streams the stage closed this round, and any it closed earlier that no round
        holds any more, are freed."""
        slots = self.slots
        for sid in result.closed:
            closed = slots.get(sid)
            if closed is not None:
                closed.on(Event.CLOSED)
                if closed.releasable:
                    self._release(closed, Event.RELEASE)
        for slot in (*round_.batch, *round_.opens):
            if slot.releasable and slots.get(slot.id) is slot:
                self._release(slot, Event.RELEASE)
            elif slot.phase is Phase.ENDING and not slot.in_flight:
                self._lifecycle[slot.id] = slot  # its close can be planned now

    def _lost(self, lost: StageLost) -> Result:
        """The stage's process died with every stream it held (opened, or opening in a
        round out): they fail with a ``StageError`` naming the stage and are freed (their
        state died with it). Streams it had not opened yet wait for the restart."""
        held = [s for s in self.slots.values() if s.phase in HOLDING or s.in_flight]
        for slot in held:
            self._fail(slot.id, "the stage's process", lost, "process")
        return Result(closed=[slot.id for slot in held])

    def _recover(self) -> None:
        hang = self._hang
        assert hang is not None
        self._hang = None
        logger.warning(
            "stage %r is back: its stuck step returned; it serves again",
            self.name,
            extra={"stage": self.name},
        )
        if hang.closes:  # the streams it failed meanwhile: free them on the stage
            self._submit(_Round(Plan(tuple(hang.closes), (), ()), (), (), 0.0))

    def _report_step_problems(self, result: Result) -> None:
        streams = ", ".join(result.stepped)
        extra = {"stage": self.name}
        if result.step_error is not None:
            self.counters.num_step_failures += 1
            logger.error(
                "stage %r step failed for streams %s",
                self.name,
                streams,
                exc_info=result.step_error,
                extra=extra,
            )
        if result.stray:
            self.counters.num_step_failures += 1
            logger.error(
                "stage %r returned outputs for streams not in its batch (%s); ignored. Batch: %s",
                self.name,
                ", ".join(result.stray),
                streams,
                extra=extra,
            )

    def _fail(self, sid: str, where: str, exc: Exception, during: StageCall = "step") -> None:
        slot = self.slots.get(sid)
        if slot is None or slot.stream.ending:
            return
        self.counters.num_stream_failures += 1
        problem = f"{where} raised {type(exc).__name__}: {exc}"
        error = StageError(self.name, sid, problem, during)
        error.__cause__ = exc
        logger.warning("%s", error, extra={"stage": self.name, "stream": sid})
        slot.stream.fail(error)

    def _release(self, slot: Slot, event: Event) -> None:
        slot.on(event)
        del self.slots[slot.id]
        slot.stream.num_steps_at[self.name] = slot.num_steps
        self._lifecycle.pop(slot.id, None)
        if slot.in_link is not None:
            slot.in_link.discard()  # finished early or ended: upstream must not wait on it
        slot.stream.released_by(self.name)


def stage_statistics(
    actors: Mapping[str, StageActor],
    audio_s_delivered: float = 0.0,
    cap: int = 0,
    factor: float = 1.0,
) -> Mapping[str, StageStatistics]:
    return MappingProxyType(
        {name: actor.statistics(audio_s_delivered, cap, factor) for name, actor in actors.items()}
    )
