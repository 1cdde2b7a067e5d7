"""The talker, on sglang-omni's scheduler hooks.

sglang-omni's Qwen3-Omni talker is ``QwenTalkerScheduler`` (an ``OmniScheduler`` over
SGLang, ``models/qwen3_omni/talker_scheduler.py``), which cannot run without SGLang.
What stands in keeps its policy:

- at most ``max_running_requests`` decode at once (``TALKER_MAX_RUNNING_REQUESTS`` = 32
  in ``config.py``; here the workload's ``max_batch_size``); the rest wait in order;
- a request is built once its payload and its first thinker chunk are there (the
  package's talker-start topology, ``TALKER_START_MIN_CHUNKS`` = 1; the legacy partial
  start waits for 5 chunks, which the synthetic workload has no reason to);
- prefill XOR decode: the talker runs with ``chunked_prefill_size=0``
  (``configure_talker_server_args``), so SGLang does not mix, and a step that admits new
  requests runs them alone (their first frame), the running ones waiting;
- the decode gate: a decode batch runs only when *every* running request has its next
  input (``is_batch_ready_to_run`` -> ``TalkerModelRunner.is_decode_batch_ready``: all
  rows need a pending thinker chunk or the thinker's stream-done); otherwise the whole
  batch waits for the next message;
- codec frames go to code2wav coalesced: the first ``window`` frames one message each,
  then ``window`` frames a message, flushed when the next frame is made, the rest at the
  end (``TalkerModelRunner``'s ``codec_coalesce_early_frames`` / ``codec_coalesce_frames``,
  which ``config.py: talker_stage`` sets to the code2wav window).

A frame costs one step; each thinker token owes ``frames_per_input`` frames (fractions
carry over), as omnitrio's synthetic talker.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch
from sglang_omni.pipeline.stage.stream_queue import StreamItem
from sglang_omni.proto.request import StagePayload
from sglang_omni.scheduling.message import OutgoingMessage, put_messages
from sglang_omni.scheduling.streaming_simple_scheduler import StreamingSimpleScheduler

from .cost import StepModel, StepTrace, TracedStage

CODE2WAV = "code2wav"
EPSILON = 1e-9


@dataclass
class _Request:
    owed: float = 0.0
    chunks: int = 0
    frames: int = 0
    input_done: bool = False
    has_payload: bool = False
    pending: list[torch.Tensor] = field(default_factory=list)  # coalesced frames


class SyntheticTalker(TracedStage, StreamingSimpleScheduler):
    def __init__(
        self,
        model: StepModel,
        max_running: int,
        frames_per_input: float,
        coalesce_frames: int,
        frame_elements: int,
    ):
        super().__init__(None)
        self.model = model
        self.max_running = max(1, max_running)
        self.frames_per_input = frames_per_input
        self.coalesce = max(1, coalesce_frames)
        self.frame_elements = max(1, frame_elements)
        self.requests: dict[str, _Request] = {}
        self.waiting: collections.deque[str] = collections.deque()
        self.active: list[str] = []
        self.trace = StepTrace("talker_ar")

    def state(self, request_id: str) -> _Request:
        request = self.requests.get(request_id)
        if request is None:
            request = self.requests[request_id] = _Request()
            self.waiting.append(request_id)
        return request

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        del payload
        self.state(request_id).has_payload = True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        del item
        if self.is_aborted(request_id):
            return []
        request = self.state(request_id)
        request.chunks += 1
        request.owed += self.frames_per_input
        return []

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        if not self.is_aborted(request_id):
            self.state(request_id).input_done = True
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        self.state(request_id).input_done = True
        return None  # completed by a step, once its frames are made

    def clear_stream_state(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        if request_id in self.active:
            self.active.remove(request_id)
        if request_id in self.waiting:
            self.waiting.remove(request_id)

    def buildable(self, request_id: str) -> bool:
        request = self.requests.get(request_id)
        return request is not None and request.has_payload and request.chunks >= 1

    def ready_for_decode(self, request_id: str) -> bool:
        request = self.requests[request_id]
        return request.owed >= 1 - EPSILON or request.input_done

    def admissible(self) -> list[str]:
        room = self.max_running - len(self.active)
        return [r for r in self.waiting if self.buildable(r)][: max(0, room)]

    def has_ready_work(self) -> bool:
        with self.state_lock:
            if self.admissible():
                return True
            return bool(self.active) and all(map(self.ready_for_decode, self.active))

    def run_ready_step(self) -> None:
        with self.state_lock:
            admitted = self.admissible()
            if admitted:  # a prefill step of the new requests alone
                for request_id in admitted:
                    self.waiting.remove(request_id)
                batch = admitted
            else:
                batch = list(self.active)
            working = [r for r in batch if self.requests[r].owed >= 1 - EPSILON]
        self.trace.step(self.model, "prefill" if admitted else "decode", len(working))
        messages: list[OutgoingMessage] = []
        finished: list[str] = []
        with self.state_lock:
            for request_id in batch:
                request = self.requests.get(request_id)
                if request is None or self.is_aborted(request_id):
                    continue
                if request_id in admitted:
                    self.active.append(request_id)
                if request_id in working:
                    request.owed -= 1
                    request.frames += 1
                    self.add_frame(request_id, request, messages)
                if request.input_done and request.owed < 1 - EPSILON:
                    finished.append(request_id)
            for request_id in finished:
                request = self.requests[request_id]
                self.flush(request_id, request, messages)
            put_messages(self.outbox, messages)
            for request_id in finished:
                self.active.remove(request_id)
                if request_id in self.stream_payloads:
                    payload = self.stream_payloads[request_id]
                    payload.data = {"num_frames": self.requests[request_id].frames}
                    result = OutgoingMessage(request_id, "result", data=payload)
                    self.complete_stream_request(request_id, [result])

    def frame(self) -> torch.Tensor:
        return torch.zeros(self.frame_elements, dtype=torch.long)

    def add_frame(self, request_id: str, request: _Request, out: list[OutgoingMessage]) -> None:
        if request.frames <= self.coalesce:  # the early frames, one message each
            out.append(self.message(request_id, self.frame().unsqueeze(0)))
            return
        if len(request.pending) >= self.coalesce:
            self.flush(request_id, request, out)
        request.pending.append(self.frame())

    def flush(self, request_id: str, request: _Request, out: list[OutgoingMessage]) -> None:
        if request.pending:
            out.append(self.message(request_id, torch.stack(request.pending)))
            request.pending = []

    @staticmethod
    def message(request_id: str, frames: torch.Tensor) -> OutgoingMessage:
        return OutgoingMessage(
            request_id, "stream", data=frames, target=CODE2WAV, metadata={"stream": True}
        )


def create_talker(
    model_path: str = "",
    *,
    step: dict[str, float],
    max_running_requests: int,
    frames_per_input: float = 1.0,
    coalesce_frames: int = 1,
    payload_bytes: int = 128,
) -> SyntheticTalker:
    del model_path
    return SyntheticTalker(
        StepModel.from_spec(step),
        max_running_requests,
        frames_per_input,
        coalesce_frames,
        payload_bytes // 8,
    )
