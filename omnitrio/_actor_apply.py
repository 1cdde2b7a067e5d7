"""A stage actor's apply half (back on trio): a round's result, in the order it matters,
and what a lost or stuck stage leaves to settle."""

from __future__ import annotations

import logging
import time

from ._actor_base import ActorBase
from ._contract import ProtocolError
from ._items import AudioChunk
from ._placement import StageLost
from ._round import Round
from ._runner import Plan, Result
from ._slot import HOLDING, Event, Phase, Slot
from ._stage import StreamOutput, StreamWork

logger = logging.getLogger(__name__)


class Applying(ActorBase):
    """The apply half of ``StageActor``."""

    def _apply_round(self, round_: Round) -> None:
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

    def _unwrap(self, round_: Round) -> Result:
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

    def _settle_opens(self, round_: Round, result: Result) -> None:
        for slot in round_.opens:
            slot.in_flight -= 1
        opened = set(result.opened)
        for slot in round_.opens:
            if self.slots.get(slot.id) is slot and slot.phase in (Phase.OPENING, Phase.ENDING):
                slot.on(Event.OPENED if slot.id in opened else Event.OPEN_FAILED)
        for sid, exc in result.errors.items():
            self._fail(sid, "open_stream", exc, "open_stream")

    def _route_outputs(
        self, round_: Round, result: Result
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

    def _settle_closes(self, round_: Round, result: Result) -> None:
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
            self._submit(Round(Plan(tuple(hang.closes), (), ()), (), (), 0.0))

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
