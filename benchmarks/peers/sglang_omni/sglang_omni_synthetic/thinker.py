"""The entry stage and the thinker, on sglang-omni's scheduler hooks.

sglang-omni's Qwen3-Omni thinker is an ``OmniScheduler`` over the SGLang engine
(``models/qwen3_omni/stages.py: create_sglang_thinker_executor_from_config``), which
cannot run without SGLang. What stands in keeps its batching policy, as that factory
sets it:

- continuous batching up to ``max_running_requests`` (the workload's ``max_batch_size``);
  the rest wait in arrival order, as SGLang's ``waiting_queue`` holds them;
- ``enable_mixed_chunk=True`` with ``chunked_prefill_size=8192``: a step that admits
  new requests prefills them *and* decodes the running ones (the factory's note: prefill
  XOR decode stalled decodes), so a step costs the synthetic profile's intercept, its
  per-stream cost for the whole batch and the prefill of the new ones; each request in
  the step makes one token;
- each token goes out as a stream chunk to ``decode`` (its id) and to ``talker_ar``
  (the hidden rows, ``payload_bytes``), the stage's ``stream_to`` in
  ``models/qwen3_omni/config.py: thinker_stage``; the finished request's payload goes
  to ``decode`` (``next``) and the runtime signals stream-done to both.

The loop is ``StreamingSimpleScheduler.start``: it drains every queued message into
state before each step (``has_ready_work`` / ``run_ready_step``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch
from sglang_omni.proto.request import StagePayload
from sglang_omni.scheduling.message import OutgoingMessage, put_messages
from sglang_omni.scheduling.simple_scheduler import SimpleScheduler
from sglang_omni.scheduling.streaming_simple_scheduler import StreamingSimpleScheduler

from .cost import StepModel, StepTrace, TracedStage

DECODE = "decode"
TALKER = "talker_ar"


def _words(payload: StagePayload) -> int:
    inputs = payload.request.inputs
    return len(inputs.split()) if isinstance(inputs, str) else 0


def create_preprocessing(model_path: str = "") -> SimpleScheduler:
    """The entry stage (``preprocessing`` in the package's layout): the request as it came,
    to the thinker and the talker, as ``resolve_encoder_next_stages`` routes a spoken reply."""
    del model_path
    return SimpleScheduler(lambda payload: payload)


@dataclass
class _Request:
    payload: StagePayload
    steps: int
    words: int
    units: int = 0


class SyntheticThinker(TracedStage, StreamingSimpleScheduler):
    def __init__(self, model: StepModel, max_running: int, steps_cap: int, payload_bytes: int):
        super().__init__(None)
        self.model = model
        self.max_running = max(1, max_running)
        self.steps_cap = steps_cap
        self.row_elements = max(1, payload_bytes // 2)  # bf16 rows
        self.waiting: collections.deque[str] = collections.deque()
        self.active: dict[str, _Request] = {}
        self.requests: dict[str, _Request] = {}
        self.trace = StepTrace("thinker")

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        params = payload.request.params or {}
        steps = int(params.get("max_new_tokens") or self.steps_cap)
        self.requests[request_id] = _Request(payload, min(steps, self.steps_cap), _words(payload))
        self.waiting.append(request_id)

    def clear_stream_state(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.active.pop(request_id, None)
        if request_id in self.waiting:
            self.waiting.remove(request_id)

    def has_ready_work(self) -> bool:
        return bool(self.active or self.waiting)

    def run_ready_step(self) -> None:
        with self.state_lock:
            while self.waiting and len(self.active) < self.max_running:
                request_id = self.waiting.popleft()
                if request_id in self.requests and not self.is_aborted(request_id):
                    self.active[request_id] = self.requests[request_id]
            batch = list(self.active.items())
        fresh = [r for _, r in batch if r.units == 0]
        kind = "mixed" if fresh else "decode"
        self.trace.step(self.model, kind, len(batch), len(fresh), sum(r.words for r in fresh))
        messages: list[OutgoingMessage] = []
        finished: list[tuple[str, _Request]] = []
        for request_id, request in batch:
            request.units += 1
            hidden = torch.zeros(self.row_elements, dtype=torch.bfloat16)
            messages.append(
                OutgoingMessage(request_id, "stream", data=hidden, target=TALKER, metadata={})
            )
            messages.append(
                OutgoingMessage(
                    request_id, "stream", data=torch.tensor(request.units), target=DECODE
                )
            )
            if request.units >= request.steps:
                finished.append((request_id, request))
        with self.state_lock:
            put_messages(self.outbox, [m for m in messages if not self.is_aborted(m.request_id)])
            for request_id, request in finished:
                self.active.pop(request_id, None)
                payload = request.payload
                payload.data = {"num_tokens": request.units}
                result = OutgoingMessage(request_id, "result", data=payload)
                self.complete_stream_request(request_id, [result])


def create_thinker(
    model_path: str = "",
    *,
    step: dict[str, float],
    max_running_requests: int,
    steps: int = 1024,
    payload_bytes: int = 0,
) -> SyntheticThinker:
    del model_path
    return SyntheticThinker(StepModel.from_spec(step), max_running_requests, steps, payload_bytes)
