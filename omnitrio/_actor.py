"""A stage actor: one trio task plus one dedicated worker thread.

The task decides, the thread executes. Each turn of the loop is::

    plan     (trio)    drop ended streams, pick a batch of ready streams that fit,
                       reserve their credit, take their inputs
    execute  (thread)  close/open per-stream state, stage.step(batch), close finished
    apply    (trio)    hand payloads to the next stage and visible items to clients,
                       fail streams whose work failed

One crossing into the thread and one back per turn, whatever the batch size.
When nothing is ready the task waits on its ``Wakeup``, which every input,
freed credit, new stream and ended stream sets: no polling, no timeouts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

import trio

from ._config import StageSpec
from ._contract import Limits, ProtocolError
from ._errors import ConfigError, StageError
from ._link import Link, Wakeup
from ._runner import Plan, Result, StageRunner
from ._scheduler import Candidate, pick_batch
from ._stage import StreamOutput, StreamWork
from ._stream import Stream
from ._worker import WorkerThread

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Slot:
    """One stream as one stage sees it."""

    stream: Stream
    inbox: Link | None  # None for the first stage
    outbox: Link | None  # None for the last stage
    opened: bool = False
    more: bool = False
    input_closed_delivered: bool = False


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
    busy_s: float = 0.0
    idle_s: float = 0.0


class StageActor:
    """Runs one configured stage. Made by the supervisor in ``open_pipeline``."""

    def __init__(self, spec: StageSpec, source: str) -> None:
        self.spec = spec
        self.name = spec.name
        self.wakeup = Wakeup()
        self.counters = _Counters()
        self.slots: dict[str, _Slot] = {}
        self._source = source
        self._runner: StageRunner | None = None
        self._worker: WorkerThread | None = None
        self._unopened: list[str] = []
        self._ending: set[str] = set()
        self.limits = Limits(None, 0, 0, has_outbox=False)  # the runner's, once loaded
        self.hung = False

    # ----- lifecycle ----------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    async def run(
        self,
        limits: tuple[int | None, int],
        shutdown_timeout_s: float,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Load the stage on its thread, report ready, then serve until cancelled.

        KI-protected: Ctrl-C never lands halfway through a scheduling decision; it
        reaches the main task, whose exit cancels this actor cleanly.

        ``limits`` is (outgoing edge capacity or None, client capacity). On
        cancellation every open stream is closed on the stage and the thread is
        joined, shielded and bounded by ``shutdown_timeout_s``.
        """
        self._runner = StageRunner(self.spec, self._source, has_outbox=limits[0] is not None)
        self._worker = WorkerThread(f"omnitrio-stage-{self.name}")
        try:
            started = time.perf_counter()
            logger.info(
                "loading stage %r (%s)", self.name, self.spec.impl, extra={"stage": self.name}
            )
            await self._worker.run(self._runner.load)
            logger.info(
                "stage %r ready in %.2f s",
                self.name,
                time.perf_counter() - started,
                extra={"stage": self.name},
            )
            self.limits = self._runner.limits
            self._check_limits(*limits)
            task_status.started()
            await self._serve()
        finally:
            await self._shutdown(shutdown_timeout_s)

    def _check_limits(self, edge_capacity: int | None, client_capacity: int) -> None:
        stage = self.limits
        if edge_capacity is not None and stage.max_payloads_per_step > edge_capacity:
            raise ConfigError(
                self._source,
                f"edges[from={self.name}].capacity",
                f"{edge_capacity} is below stage {self.name!r} max_payloads_per_step="
                f"{stage.max_payloads_per_step}; raise the capacity",
            )
        if stage.max_visible_per_step > client_capacity:
            raise ConfigError(
                self._source,
                "pipeline.client_capacity",
                f"{client_capacity} is below stage {self.name!r} max_visible_per_step="
                f"{stage.max_visible_per_step}; raise it",
            )

    async def _shutdown(self, timeout_s: float) -> None:
        worker, runner = self._worker, self._runner
        if worker is None or runner is None:
            return
        deadline = trio.current_time() + timeout_s
        # Queued behind any job still running (a load or a step cut off by
        # cancellation), the final job closes whatever the stage holds by then.
        with trio.CancelScope(shield=True, deadline=deadline):
            await worker.run(runner.close_all)
        if not await worker.stop(deadline):
            logger.error(
                "stage %r did not finish its step within %.1f s of shutdown; streams in flight: %s",
                self.name,
                timeout_s,
                ", ".join(self.slots) or "none",
                extra={"stage": self.name},
            )
        for slot in list(self.slots.values()):
            self._release(slot)

    # ----- the loop -----------------------------------------------------------------

    async def _serve(self) -> None:
        worker, runner = self._worker, self._runner
        assert worker is not None
        assert runner is not None
        while True:
            plan = self._plan()
            if plan is None:
                started = time.perf_counter()
                await self.wakeup.wait()
                self.counters.idle_s += time.perf_counter() - started
                continue
            with trio.move_on_after(self.spec.step_timeout_s or math.inf) as watchdog:
                result = await worker.run(partial(runner.execute, plan))
            if watchdog.cancelled_caught:
                await self._hung(plan)
            self._apply(plan, result)

    async def _hung(self, plan: Plan) -> NoReturn:
        """The worker thread did not return within ``step_timeout_s``: it cannot be
        interrupted, so the stage is out of service. Its streams fail with a
        ``StageError`` naming it; streams that arrive later fail at once; the
        rest of the pipeline serves on. Never returns (cancelled at shutdown)."""
        self.hung = True
        in_flight = [w.stream_id for w in plan.batch] + [sid for sid, _ in plan.opens]
        logger.error(
            "stage %r is hung: a step has not returned for %.1f s; streams in flight: %s",
            self.name,
            self.spec.step_timeout_s,
            ", ".join(in_flight) or "none",
            extra={"stage": self.name},
        )
        problem = f"step did not return within step_timeout_s={self.spec.step_timeout_s}"
        while True:
            for slot in list(self.slots.values()):
                self._fail(slot.stream.id, "watchdog", TimeoutError(problem))
                self._release(slot)  # its state stays with the stuck thread
            await self.wakeup.wait()

    def add(self, stream: Stream, inbox: Link | None, outbox: Link | None) -> None:
        """A new stream: its state is opened on the stage at the next turn."""
        self.slots[stream.id] = _Slot(stream, inbox, outbox)
        self._unopened.append(stream.id)
        self.wakeup.set()

    def drop(self, stream_id: str) -> None:
        """The stream ended (failed or cancelled): free it at the next turn."""
        self._ending.add(stream_id)
        self.wakeup.set()

    def _plan(self) -> Plan | None:
        closes: list[str] = []
        for sid in self._ending:
            slot = self.slots.get(sid)
            if slot is not None and slot.opened:
                closes.append(sid)
            elif slot is not None:
                self._release(slot)
        self._ending.clear()
        opens = tuple(
            (sid, self.slots[sid].stream.request) for sid in self._unopened if sid in self.slots
        )
        self._unopened.clear()
        decision = pick_batch(self._candidates(), self.spec.max_batch_size)
        self.counters.num_skipped_no_credit += len(decision.skipped)
        for sid in decision.skipped:  # full streams wait at the back: scans stay O(batch)
            self.slots[sid] = self.slots.pop(sid)
        batch = tuple(self._take_work(self.slots[sid]) for sid in decision.batch)
        if not (closes or opens or batch):
            return None
        return Plan(tuple(closes), opens, batch)

    def _candidates(self) -> Iterator[Candidate]:
        """Streams with work, least recently stepped first (``slots`` is kept in that order)."""
        for slot in self.slots.values():
            if not slot.stream.ending and self._has_work(slot):
                yield Candidate(slot.stream.id, True, self._fits(slot))

    @staticmethod
    def _has_work(slot: _Slot) -> bool:
        """New input, input that just closed, or the stage asked for more."""
        inbox = slot.inbox
        if slot.more or (inbox is not None and inbox.buffered > 0):
            return True
        return (inbox is None or inbox.producers_done) and not slot.input_closed_delivered

    def _fits(self, slot: _Slot) -> bool:
        """Room for a whole step's output on every channel the stream writes to."""
        if slot.stream.client.free < self.limits.max_visible_per_step:
            return False
        return slot.outbox is None or slot.outbox.free >= self.limits.max_payloads_per_step

    def _take_work(self, slot: _Slot) -> StreamWork:
        slot.stream.client.reserve(self.limits.max_visible_per_step)
        if slot.outbox is not None:
            slot.outbox.reserve(self.limits.max_payloads_per_step)
        if slot.inbox is None:
            return StreamWork(slot.stream.id, (), True)
        inputs, closed = slot.inbox.take(self.limits.max_inputs_per_step)
        return StreamWork(slot.stream.id, tuple(inputs), closed)

    # ----- back in trio -------------------------------------------------------------

    def _apply(self, plan: Plan, result: Result) -> None:
        counters = self.counters
        counters.busy_s += result.busy_s
        if plan.batch:
            counters.num_steps += 1
            counters.num_batched += len(plan.batch)
            counters.last_batch_size = len(plan.batch)
            counters.max_batch_size_seen = max(counters.max_batch_size_seen, len(plan.batch))
        for sid in result.opened:
            if sid in self.slots:
                self.slots[sid].opened = True
        for sid, exc in result.errors.items():
            self._fail(sid, "open_stream", exc)
        self._report_step_problems(plan, result)
        for work in plan.batch:
            slot = self.slots.get(work.stream_id)
            if slot is None:
                continue
            self.slots[work.stream_id] = self.slots.pop(work.stream_id)  # to the back of the line
            num_visible = 0
            if result.step_error is not None:
                self._fail(work.stream_id, "step", result.step_error)
            elif work.stream_id in result.outputs:  # absent: its open_stream failed above
                num_visible = self._deliver(slot, work, result.outputs[work.stream_id])
            # Unused client credit goes back, and the stream's other stages hear of it.
            slot.stream.client.settle(self.limits.max_visible_per_step, num_visible)
            if slot.outbox is not None:
                slot.outbox.settle(self.limits.max_payloads_per_step, None)
        for sid in result.closed:
            if sid in self.slots:
                self._release(self.slots[sid])

    def _report_step_problems(self, plan: Plan, result: Result) -> None:
        streams = ", ".join(w.stream_id for w in plan.batch)
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

    def _deliver(self, slot: _Slot, work: StreamWork, output: StreamOutput) -> int:
        """Hand a checked output on; returns how many visible items went to the client."""
        if slot.stream.ending:
            return 0
        if output.error is not None:
            self._fail(work.stream_id, "step", output.error)
            return 0
        if slot.outbox is not None:
            slot.outbox.put(output.payloads)
            self.counters.num_payloads_sent += len(output.payloads)
        slot.stream.client.put(output.visible)
        self.counters.num_visible_sent += len(output.visible)
        slot.more = output.more
        slot.input_closed_delivered |= work.input_closed
        if output.done:
            if slot.outbox is not None:
                slot.outbox.producer_done()
            slot.stream.client.producer_done()
        elif work.input_closed and not output.more:
            problem = ProtocolError("neither more nor done after input closed")
            self._fail(work.stream_id, "step", problem)
        return len(output.visible)

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
