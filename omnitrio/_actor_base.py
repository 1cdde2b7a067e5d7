"""The state a stage actor's halves share (``_actor.py`` runs the loop, ``_actor_plan.py``
plans rounds, ``_actor_amend.py`` amends the queued one, ``_actor_apply.py`` applies
them): its slots, rounds out and counters, the
hand-over of a round to the stage's thread, each stream's credit, and a stream's failure
and release."""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections import deque
from functools import partial
from typing import Protocol

import outcome
import trio

from ._config import StageSpec
from ._errors import StageCall, StageError
from ._link import Wakeup
from ._newcomers import FirstWaits
from ._placement import place
from ._round import Counters, Hang, Round
from ._runner import Result
from ._scheduler import Scheduling
from ._slot import Event, Slot
from ._stage import StepLimits, StreamWork
from .admission import StepModel

logger = logging.getLogger(__name__)


class Offered(Protocol):
    """The next stage's actor, as a stage that routes payloads to it sees it."""

    def offer(self) -> None: ...


class ActorBase(ABC):
    """What the halves of ``StageActor`` share; see it for the parameters."""

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
        self.counters = Counters()
        self.slots: dict[str, Slot] = {}
        self.step_model = StepModel(spec.max_batch_size)
        self.downstream: Offered | None = None
        self._placement = place(
            spec, source, feeds_edge=feeds_edge, payloads_by_reference=payloads_by_reference
        )
        self._loading = False  # load() was called: shutdown closes what it made
        self._rounds: deque[Round] = deque()
        self._lifecycle: dict[str, Slot] = {}  # slots in NEW or ENDING: planning acts on them
        self._first_waits = FirstWaits()
        self._hang: Hang | None = None
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

    @abstractmethod
    def _advance(self) -> bool:
        """Apply the rounds that came back, then plan (``StageActor``)."""

    # ----- handing a round to the thread --------------------------------------------

    def _watchdog_deadline(self) -> float:
        """When the oldest round out has run for ``step_timeout_s`` (inf if none, or hung)."""
        timeout_s = self.spec.step_timeout_s
        if not self._rounds or timeout_s is None or self._hang is not None:
            return math.inf
        return self._rounds[0].since + timeout_s

    def _submit(self, round_: Round) -> None:
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

    def _round_done(self, round_: Round, value: outcome.Outcome[Result]) -> None:
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

    # ----- a stream's credit --------------------------------------------------------

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

    # ----- a stream's failure and release -------------------------------------------

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
