"""A stage actor: one trio task plus the place its stage executes (a dedicated
worker thread, or a Ray actor: ``_placement.py``).

The task decides, the thread executes. Each turn is::

    plan     (trio)    drop ended streams, pick a batch of ready streams that fit,
                       reserve their credit, take their inputs
    execute  (thread)  close/open per-stream state, stage.step(batch), close finished
                       (in a Ray actor's process with ``placement: ray``)
    apply    (trio)    hand payloads to the next stage (which plans at once), then
                       visible items to clients; fail streams whose work failed

Up to two turns are out at once: while the thread runs turn N, turn N+1 is
already planned, its credit reserved, and queued behind it, so the thread goes
from one step to the next without waiting for trio. One crossing into the
thread and one back per turn, whatever the batch size; a finished turn is
applied, and the next planned, in the callback that brings its result back.
When nothing is ready the task waits on its ``Wakeup``, which only what it
waits for sets (an input, credit it was short of, a new or ended stream): no
polling, no timeouts but the watchdog's.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

import outcome
import trio

from ._config import StageSpec
from ._contract import Limits, ProtocolError
from ._errors import StageError
from ._link import Link, Wakeup
from ._placement import StageLost, place
from ._runner import Plan, Result
from ._scheduler import Candidate, pick_batch
from ._stage import StreamOutput, StreamWork
from ._statistics import StageStatistics
from ._stream import StreamState

logger = logging.getLogger(__name__)

MAX_TURNS_IN_FLIGHT = 2
"""The running turn and the next one, planned and queued behind it."""


@dataclass(eq=False, slots=True)
class _Slot:
    """One stream as one stage sees it."""

    stream: StreamState
    inbox: Link | None  # None for the first stage
    outbox: Link | None  # None for the last stage (or a side stage)
    opened: bool = False
    more: bool = False
    input_closed_delivered: bool = False
    in_flight: int = 0  # turns out (planned, not applied) that open or step it
    closed_on_stage: bool = False  # the runner closed it; released once no turn holds it
    waiting: bool = False  # the actor's wake-up is on one of its links, for credit


@dataclass(eq=False, slots=True)
class _Turn:
    """A plan handed to the thread, and what it holds, until its result is applied."""

    plan: Plan
    batch: tuple[_Slot, ...]  # the slots of plan.batch, in order (their credit is reserved)
    opens: tuple[_Slot, ...]
    since: float  # trio time it became the oldest turn out (the watchdog's start)
    result: outcome.Outcome[Result] | None = None


@dataclass
class _Counters:
    num_steps: int = 0
    num_batched: int = 0
    max_batch_size_seen: int = 0
    last_batch_size: int = 0
    num_skipped_no_credit: int = 0
    num_payloads_sent: int = 0
    num_visible_sent: int = 0
    num_stream_failures: int = 0
    num_step_failures: int = 0
    num_empty_plans: int = 0
    busy_s: float = 0.0
    trio_s: float = 0.0
    idle_s: float = 0.0


@dataclass
class _Hang:
    """The stage is out of service: a step outlived ``step_timeout_s``."""

    turn: _Turn
    problem: str
    closes: list[str] = field(default_factory=list)


class StageActor:
    """Runs one configured stage. Made by the supervisor in ``open_pipeline``.

    ``outbox`` is False for the last stage of the chain and for a side stage;
    ``payloads_by_reference``: this stage and the next are both on Ray.
    """

    def __init__(
        self,
        spec: StageSpec,
        source: str,
        *,
        has_outbox: bool,
        payloads_by_reference: bool = False,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.wakeup = Wakeup()
        self.counters = _Counters()
        self.slots: dict[str, _Slot] = {}
        self.downstream: StageActor | None = None
        self._placement = place(
            spec, source, has_outbox=has_outbox, payloads_by_reference=payloads_by_reference
        )
        self._loading = False  # load() was called: shutdown closes what it made
        self._turns: deque[_Turn] = deque()
        self._unopened: list[_Slot] = []
        self._ending: set[str] = set()
        self._hang: _Hang | None = None
        self._serving = False
        self._waiting: trio.CancelScope | None = None  # the loop's wait, while it waits
        self._idle_since: float | None = None  # when the last turn out came back
        self._skipped = False  # the last plan left a stream out for want of credit
        self.limits = Limits(None, 0, 0, has_outbox=has_outbox)  # the runner's, once loaded

    @property
    def hung(self) -> bool:
        """Out of service: a step outlived ``step_timeout_s``, or the stage's Ray actor
        is being restarted."""
        return self._hang is not None or self._placement.restarting

    # ----- lifecycle ----------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def statistics(self) -> StageStatistics:
        """A frozen snapshot of this stage. Cheap; never blocks."""
        c = self.counters
        return StageStatistics(
            name=self.name,
            num_open_streams=len(self.slots),
            queue_depth=MappingProxyType(
                {sid: s.inbox.buffered if s.inbox else 0 for sid, s in self.slots.items()}
            ),
            num_steps=c.num_steps,
            last_batch_size=c.last_batch_size,
            max_batch_size=c.max_batch_size_seen,
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
        )

    async def load(self) -> Limits:
        """Start the stage's thread (or Ray actor) and load the stage; returns its ``Limits``."""
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
            self._release(slot)

    # ----- streams coming and going -------------------------------------------------

    def add(self, stream: StreamState, inbox: Link | None, outbox: Link | None) -> None:
        """A new stream: its state is opened on the stage at the next turn."""
        slot = _Slot(stream, inbox, outbox)
        self.slots[stream.id] = slot
        self._unopened.append(slot)
        self.wakeup.set()

    def drop(self, stream_id: str) -> None:
        """The stream ended (failed or cancelled): free it at the next turn."""
        self._ending.add(stream_id)
        self.wakeup.set()

    def offer(self) -> None:
        """Upstream just put payloads on this stage's incoming edges: plan now, from
        upstream's apply, so the work is queued before upstream delivers to clients."""
        if self._serving and self._hang is None:
            self._fill()
        else:
            self.wakeup.set()

    # ----- the loop -----------------------------------------------------------------

    async def _serve(self) -> None:
        """The task's part: plan on wake-ups, and the watchdog. A finished turn is
        applied where its result lands (``_turn_done``), without waking the task."""
        turns = self._turns
        self._idle_since = time.perf_counter()
        while True:
            # Everything that happened so far is seen by this plan: a wake-up already
            # pending (an input, a new stream) is spent.
            self.wakeup.consume()
            acted = self._fill()
            woken = False
            with trio.CancelScope(deadline=self._watchdog_deadline()) as self._waiting:
                woken = await self.wakeup.wait()
            self._waiting = None
            applied = self._apply_finished()
            if turns and trio.current_time() >= self._watchdog_deadline():
                self._hung(turns[0])
            elif not woken or applied or acted or self.hung or len(turns) >= 2:
                continue
            elif not self._fill() and not self._skipped:
                # Woken, and no stream had work (a stream that lost the credit it was
                # woken for to another stage is counted in num_skipped_no_credit).
                self.counters.num_empty_plans += 1

    def _turn_done(self, turn: _Turn, value: outcome.Outcome[Result]) -> None:
        """A turn's result is back on the trio thread (``run_sync_soon``): apply it and
        plan the next turn right here, one task switch earlier than the actor's task
        could. Never raises (this runs in trio's own callback task)."""
        turn.result = value
        if not self._serving:
            return  # shutting down: the final job closes what the stage holds
        try:
            self._apply_finished()
            self.wakeup.consume()  # this plan sees everything a pending wake-up was for
            self._fill()
            if self._waiting is not None:
                self._waiting.deadline = self._watchdog_deadline()
        except Exception:
            logger.exception("stage %r: applying a turn failed", self.name)
            self.wakeup.set()

    def _apply_finished(self) -> bool:
        """Apply the finished turns at the head, in order. True if there were any."""
        turns = self._turns
        applied = False
        while turns and turns[0].result is not None:
            self._apply(turns.popleft())
            applied = True
            if turns:
                turns[0].since = trio.current_time()
            else:
                self._idle_since = time.perf_counter()
        return applied

    def _watchdog_deadline(self) -> float:
        """When the oldest turn out has run for ``step_timeout_s`` (inf if none, or hung)."""
        timeout_s = self.spec.step_timeout_s
        if not self._turns or timeout_s is None or self._hang is not None:
            return math.inf
        return self._turns[0].since + timeout_s

    def _fill(self) -> bool:
        """Plan and submit turns while fewer than two are out. True if it did anything."""
        if self._hang is not None:
            self._fail_all()
            return True
        acted = False
        while len(self._turns) < MAX_TURNS_IN_FLIGHT:
            turn = self._plan()
            if turn is None:
                break
            acted = True
            if turn.plan.closes or turn.opens or turn.batch:
                self._submit(turn)
        return acted

    def _submit(self, turn: _Turn) -> None:
        first = not self._turns
        self._turns.append(turn)
        if first:
            turn.since = trio.current_time()
            if self._idle_since is not None:
                self.counters.idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None
            if self._waiting is not None:  # submitted from outside the task: arm the watchdog
                self._waiting.deadline = self._watchdog_deadline()
        self._placement.submit(turn.plan, partial(self._turn_done, turn))

    def _hung(self, turn: _Turn) -> None:
        """The oldest turn did not return within ``step_timeout_s``. A thread cannot be
        interrupted, so the stage is out of service until it does: its streams fail
        with a ``StageError`` naming it, streams that arrive meanwhile fail at once,
        and the rest of the pipeline serves on. When the step returns, the stage
        serves again (the streams it failed stay failed)."""
        in_flight = [w.stream_id for w in turn.plan.batch] + [sid for sid, _ in turn.plan.opens]
        logger.error(
            "stage %r is hung: a step has not returned for %.1f s; streams in flight: %s",
            self.name,
            self.spec.step_timeout_s,
            ", ".join(in_flight) or "none",
            extra={"stage": self.name},
        )
        problem = f"step did not return within step_timeout_s={self.spec.step_timeout_s}"
        self._hang = _Hang(turn, problem)
        self._fail_all()

    def _fail_all(self) -> None:
        hang = self._hang
        assert hang is not None
        for slot in list(self.slots.values()):
            self._fail(slot.stream.id, "watchdog", TimeoutError(hang.problem))
            if slot.opened or slot.in_flight:
                hang.closes.append(slot.stream.id)  # closed on the stage once it is back
            self._release(slot)
        self._unopened.clear()
        self._ending.clear()

    # ----- plan (trio) --------------------------------------------------------------

    def _plan(self) -> _Turn | None:
        started = time.perf_counter()
        turn = self._plan_turn()
        self.counters.trio_s += time.perf_counter() - started
        return turn

    def _plan_turn(self) -> _Turn | None:
        """One turn's work, or None if there is none. Releases ended streams the stage
        never opened on the way (that counts as work done: it returns an empty turn)."""
        closes: list[str] = []
        released = False
        if self._ending:
            for sid in list(self._ending):
                slot = self.slots.get(sid)
                if slot is not None and slot.in_flight:
                    continue  # decided once its turn is back
                self._ending.discard(sid)
                if slot is not None and slot.opened and not slot.closed_on_stage:
                    closes.append(sid)
                elif slot is not None:
                    self._release(slot)
                    released = True
        opens: list[_Slot] = []
        if self._unopened:
            opens = [s for s in self._unopened if self.slots.get(s.stream.id) is s]
            self._unopened.clear()
        decision = pick_batch(self._candidates(), self.spec.max_batch_size)
        slots = self.slots
        self._skipped = bool(decision.skipped)
        if decision.skipped:
            self.counters.num_skipped_no_credit += len(decision.skipped)
            for sid in decision.skipped:  # full streams wait at the back: scans stay O(batch)
                slots[sid] = slots.pop(sid)
        picked: list[_Slot] = []
        for sid in decision.batch:  # stepped streams go to the back of the line
            slot = slots[sid] = slots.pop(sid)
            picked.append(slot)
        batch = tuple(picked)
        if not (closes or opens or batch):
            return None if not released else _Turn(Plan((), (), ()), (), (), 0.0)
        for slot in opens:
            slot.in_flight += 1
        plan = Plan(
            tuple(closes),
            tuple((s.stream.id, s.stream.request) for s in opens),
            tuple(self._take_work(slot) for slot in batch),
        )
        return _Turn(plan, batch, tuple(opens), 0.0)

    def _candidates(self) -> Iterator[Candidate]:
        """Streams with work, least recently planned first (``slots`` is kept in that order).

        A stream whose last turn is still out is planned again on what trio knows
        (the runner skips it if that step said otherwise); one that does not fit a
        second time is left for after its turn is back, not counted as skipped.
        """
        for slot in self.slots.values():
            if slot.stream.ending or not self._has_work(slot):
                continue
            fits = self._fits(slot)
            if fits or not slot.in_flight:
                yield Candidate(slot.stream.id, True, fits)

    @staticmethod
    def _has_work(slot: _Slot) -> bool:
        """New input, input that just closed, or the stage asked for more."""
        inbox = slot.inbox
        if slot.more or (inbox is not None and inbox.buffered > 0):
            return True
        return (inbox is None or inbox.producers_done) and not slot.input_closed_delivered

    def _fits(self, slot: _Slot) -> bool:
        """Room for a whole step's output on every channel the stream writes to. If not,
        the actor waits on the channel that is short (only that wakes it)."""
        limits = self.limits
        client = slot.stream.client
        if client.free < limits.max_visible_per_step:
            if not slot.in_flight:
                client.wait_for_credit(self.wakeup, limits.max_visible_per_step)
                slot.waiting = True
            return False
        outbox = slot.outbox
        if outbox is not None and outbox.free < limits.max_payloads_per_step:
            if not slot.in_flight:
                outbox.wait_for_credit(self.wakeup, limits.max_payloads_per_step)
                slot.waiting = True
            return False
        return True

    def _take_work(self, slot: _Slot) -> StreamWork:
        limits = self.limits
        slot.in_flight += 1
        client, outbox = slot.stream.client, slot.outbox
        client.reserve(limits.max_visible_per_step)
        if slot.waiting:  # it fits now: a wake-up for its credit would find nothing to do
            slot.waiting = False
            client.stop_waiting(self.wakeup)
            if outbox is not None:
                outbox.stop_waiting(self.wakeup)
        if outbox is not None:
            outbox.reserve(limits.max_payloads_per_step)
        if slot.inbox is None:
            return StreamWork(slot.stream.id, (), True)
        inputs, closed = slot.inbox.take(limits.max_inputs_per_step)
        return StreamWork(slot.stream.id, tuple(inputs), closed)

    # ----- apply (back in trio) -----------------------------------------------------

    def _apply(self, turn: _Turn) -> None:
        started = time.perf_counter()
        self._apply_turn(turn)
        self.counters.trio_s += time.perf_counter() - started

    def _apply_turn(self, turn: _Turn) -> None:
        try:
            result = turn.result.unwrap() if turn.result is not None else Result()
        except StageLost as lost:
            result = self._lost(lost)
        except Exception as broken:  # the runner itself broke: a runtime bug, loud
            logger.exception("stage %r: a turn failed outside the stage", self.name)
            stepped = [w.stream_id for w in turn.plan.batch]
            result = Result(stepped=stepped, step_error=broken)
        if self._hang is not None and self._hang.turn is turn:
            self._recover()
        plan, counters = turn.plan, self.counters
        counters.busy_s += result.busy_s
        if result.stepped:
            counters.num_steps += 1
            counters.num_batched += len(result.stepped)
            counters.last_batch_size = len(result.stepped)
            counters.max_batch_size_seen = max(counters.max_batch_size_seen, len(result.stepped))
        for slot in turn.opens:
            slot.in_flight -= 1
        for sid in result.opened:
            opened = self.slots.get(sid)
            if opened is not None:
                opened.opened = True
        for sid, exc in result.errors.items():
            self._fail(sid, "open_stream", exc)
        self._report_step_problems(plan, result)
        # The hot loops: O(batch), a handful of attribute reads per stream.
        stepped = result.stepped
        in_step = None if len(stepped) == len(plan.batch) else set(stepped)
        outputs, step_error = result.outputs, result.step_error
        slots = self.slots
        max_payloads = self.limits.max_payloads_per_step
        max_visible = self.limits.max_visible_per_step
        delivered: list[tuple[_Slot, StreamWork, StreamOutput]] = []
        routed = False
        for slot, work in zip(turn.batch, plan.batch, strict=True):
            slot.in_flight -= 1
            sid = work.stream_id
            outbox = slot.outbox
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
                        delivered.append((slot, work, output))
                        routed |= outbox is not None
                        self._route(slot, work, output)
                        if outbox is not None:
                            outbox.settle(max_payloads, None)
                        continue
            # Not delivered: nothing will use this stream's reservations.
            slot.stream.client.settle(max_visible, 0)
            if outbox is not None:
                outbox.settle(max_payloads, None)
        # Downstream work is queued before any client hears of this step.
        if routed and self.downstream is not None:
            self.downstream.offer()
        num_visible = 0
        for slot, work, output in delivered:
            visible = output.visible
            client = slot.stream.client
            if visible:
                client.put(visible)
                num_visible += len(visible)
            # Unused client credit goes back, and a stage short of it hears of it.
            client.settle(max_visible, len(visible))
            if output.done:
                client.producer_done()
            elif work.input_closed and not output.more:
                problem = ProtocolError("neither more nor done after input closed")
                self._fail(work.stream_id, "step", problem)
        counters.num_visible_sent += num_visible
        for sid in result.closed:
            closed = slots.get(sid)
            if closed is not None:
                closed.closed_on_stage = True
                if not closed.in_flight:
                    self._release(closed)
        for slot in turn.batch:  # closed by an earlier turn, and now no turn holds it
            if slot.closed_on_stage and not slot.in_flight and slots.get(slot.stream.id) is slot:
                self._release(slot)
        for slot in turn.opens:
            if slot.closed_on_stage and not slot.in_flight and slots.get(slot.stream.id) is slot:
                self._release(slot)

    def _route(self, slot: _Slot, work: StreamWork, output: StreamOutput) -> None:
        """An output's payloads onto the outgoing edge (the consumer is offered the work
        after the whole batch), and what the stage said about the stream."""
        outbox = slot.outbox
        if outbox is not None:
            if output.payloads:
                outbox.put(output.payloads, wake=False)
                self.counters.num_payloads_sent += len(output.payloads)
            if output.done:
                outbox.producer_done(wake=False)
        slot.more = output.more
        slot.input_closed_delivered |= work.input_closed

    def _lost(self, lost: StageLost) -> Result:
        """The stage's process died with every stream it held (opened, or opening in a
        turn out): they fail with a ``StageError`` naming the stage and are freed (their
        state died with it). Streams it had not opened yet wait for the restart."""
        held = [s for s in self.slots.values() if s.opened or s.in_flight]
        for slot in held:
            self._fail(slot.stream.id, "the stage's process", lost)
        return Result(closed=[slot.stream.id for slot in held])

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
            self._submit(_Turn(Plan(tuple(hang.closes), (), ()), (), (), 0.0))

    def _report_step_problems(self, plan: Plan, result: Result) -> None:
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

    def _fail(self, sid: str, where: str, exc: Exception) -> None:
        slot = self.slots.get(sid)
        if slot is None or slot.stream.ending:
            return
        self.counters.num_stream_failures += 1
        error = StageError(self.name, sid, f"{where} raised {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        logger.warning("%s", error, extra={"stage": self.name, "stream": sid})
        slot.stream.fail(error)

    def _release(self, slot: _Slot) -> None:
        del self.slots[slot.stream.id]
        if slot.inbox is not None:
            slot.inbox.discard()  # finished early or ended: upstream must not wait on it
        slot.stream.released_by(self.name)


def stage_statistics(actors: Mapping[str, StageActor]) -> Mapping[str, StageStatistics]:
    return MappingProxyType({name: actor.statistics() for name, actor in actors.items()})
