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
comes meanwhile, or an open stream round N+1 does not step whose next input comes
(a playing answer's text), joins round N+1 while the thread has not started it, and
a stream round N+1 steps takes the input that came since into that step
(``_amend``, in ``_actor_amend.py``), so it waits for the running step alone, not for
two. One crossing into the thread and one back per round, whatever the batch size.
Planning starts in one place, ``_advance`` (apply the rounds that came back, then plan
while fewer than two are out), called where a round's result lands, where upstream
offers work, and from the task when its ``Wakeup`` fires (an input, credit it was
short of, a new or ended stream): no polling, no timeouts but the watchdog's.

Each stream's life at the stage is a ``Slot`` state machine (``_slot.py``). The
actor's halves are modules of their own over the state they share
(``_actor_base.py``): planning (``_actor_plan.py``), amending the queued round
(``_actor_amend.py``) and applying (``_actor_apply.py``); this one runs the loop and
answers the pipeline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

import trio

from ._actor_amend import Amending
from ._actor_apply import Applying
from ._actor_plan import Planning
from ._link import Link
from ._round import MAX_ROUNDS_OUT, Hang, Round
from ._slot import HOLDING, Event, Phase, Slot
from ._stage import StepLimits
from ._statistics import StageStatistics
from ._stream import StreamState
from .admission import ACTIVE_WINDOW_S, Factor

logger = logging.getLogger(__name__)

_LIVE = frozenset({Phase.NEW, Phase.OPENING, Phase.OPEN})


class StageActor(Applying, Planning, Amending):
    """Runs one configured stage. Made by the supervisor in ``open_pipeline``.

    ``feeds_edge`` is False for the last stage of the chain and for a side stage;
    ``payloads_by_reference``: this stage and the next are both on Ray.
    ``on_round``: called after each applied round that stepped (the supervisor's
    overload check).
    """

    on_round: Callable[[StageActor], None] | None = None

    # ----- lifecycle ----------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    def statistics(
        self, audio_s_delivered: float = 0.0, cap: int = 0, factor: Factor = 1.0
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

    def _advance(self) -> bool:
        """Where all planning starts: apply the rounds that came back, in order, then
        plan and submit rounds while fewer than two are out. True if it did anything."""
        acted = self._apply_finished()
        self.wakeup.consume()  # this plan sees everything a pending wake-up was for
        if self._hang is not None:
            self._fail_all()
            return True
        if self.limits.ends_without_input and self._lifecycle:
            acted |= self._end_empty()
        while len(self._rounds) < MAX_ROUNDS_OUT:
            round_ = self._plan()
            if round_ is None:
                return acted
            acted = True
            if round_.has_work:
                self._submit(round_)
        if self.scheduling == "deadline":
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

    def _hung(self, round_: Round) -> None:
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
        self._hang = Hang(round_, problem)
        self._fail_all()

    def _fail_all(self) -> None:
        hang = self._hang
        assert hang is not None
        for slot in list(self.slots.values()):
            self._fail(slot.id, "watchdog", TimeoutError(hang.problem), "watchdog")
            if slot.phase in HOLDING or slot.in_flight:
                hang.closes.append(slot.id)  # closed on the stage once it is back
            self._release(slot, Event.ABANDON)

    # ----- apply (back in trio) -----------------------------------------------------

    def _apply(self, round_: Round) -> None:
        started = time.perf_counter()
        self._apply_round(round_)
        self.counters.trio_s += time.perf_counter() - started
        if round_.plan.batch and self.on_round is not None:
            self.on_round(self)


def stage_statistics(
    actors: Mapping[str, StageActor],
    audio_s_delivered: float = 0.0,
    cap: int = 0,
    factor: Factor = 1.0,
) -> Mapping[str, StageStatistics]:
    return MappingProxyType(
        {name: actor.statistics(audio_s_delivered, cap, factor) for name, actor in actors.items()}
    )
