"""The per-output work of vllm-omni's head process, done for real, as the model's cost.

For each request's output of each stage step, on the orchestrator's thread
(``vllm_omni/engine/output_processor.py``, vLLM's ``OutputProcessor``):

- ``OmniRequestState.add_multimodal_tensor``: each of the step's tensors through
  ``_to_cpu`` (``detach().to("cpu", non_blocking=True).contiguous()``) and appended
  to the request's list for its key (``MultimodalPayload.merged_with``), the lists
  ``torch.cat``-ed when the stage finishes (``_consolidate_multimodal_tensors``):
  real torch tensors, as the seeds' orchestrator holds them;
- the incremental detokenizer: the new token's text appended to the request's;
- ``_new_completion_output``: a ``CompletionOutput`` with a *copy* of the
  request's cumulative token ids (``list(self.detokenizer.output_token_ids)``,
  O(length) per step), and when arrays were accumulated a second one holding
  a (shallow) snapshot of them (``MultimodalCompletionOutput``);
- ``RequestOutput`` and the request's stats (first and last token times,
  inter-token latencies);
- ``_route_output``: an ``OutputMessage`` for the final-output stages.

And per chunk, on the API server's thread, what ``serving_chat`` writes: a
pydantic chunk model dumped to JSON per text token, and for audio a WAV
(header and PCM) base64-encoded into the chunk.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import time
import wave
from dataclasses import dataclass, field
from typing import Any

import pydantic
import torch

from omnitrio import AudioChunk, TextDelta, VisibleItem


@dataclass(frozen=True)
class StageOutput:
    """One request's share of a stage step, as decoded (``EngineCoreOutput``)."""

    stream_id: str
    text: str | None
    pcm: bytes | None
    rate: int
    done: bool
    error: str | None
    arrays: dict[str, torch.Tensor]


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_token_ids: list[int]
    finish_reason: str | None
    multimodal_output: dict[str, list[torch.Tensor]]


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str
    outputs: list[CompletionOutput]
    finished: bool


@dataclass(frozen=True)
class OutputMessage:
    """What ``_route_output`` puts on the output queue for the API server."""

    request_id: str
    stage_id: int
    output: RequestOutput
    items: tuple[VisibleItem, ...]
    done_all: bool  # every stage has finished the request
    error: str | None


@dataclass
class _Stats:
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_generation_tokens: int = 0
    inter_token_s: list[float] = field(default_factory=list)


@dataclass
class RequestState:
    """A request's state on the orchestrator (``OmniRequestState``, one per stage)."""

    request_id: str
    prompt: str
    options: dict[str, Any]
    num_stages: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    accumulated: dict[tuple[int, str], list[torch.Tensor]] = field(default_factory=dict)
    stats: list[_Stats] = field(default_factory=list)
    stages_done: set[int] = field(default_factory=set)

    def process(self, stage: int, out: StageOutput) -> OutputMessage:
        """The output processor's work for one output, then its routing message."""
        if not self.stats:
            self.stats = [_Stats() for _ in range(self.num_stages)]
        now = time.perf_counter()
        for name, tensor in out.arrays.items():  # add_multimodal_tensor
            incoming = {name: tensor.detach().to("cpu", non_blocking=True).contiguous()}
            for layer, value in incoming.items():  # merged_with: list accumulation
                self.accumulated.setdefault((stage, layer), []).append(value)
        new_ids: list[int] = []
        if out.text:  # the incremental detokenizer
            new_ids = [len(self.token_ids)]
            self.token_ids += new_ids
            self.text += out.text
        finished = out.done or out.error is not None
        if finished:  # _consolidate_multimodal_tensors
            for key in [k for k in self.accumulated if k[0] == stage]:
                self.accumulated[key] = [torch.cat(self.accumulated[key], dim=0)]
        completion = CompletionOutput(  # _new_completion_output
            index=0,
            text=out.text or "",
            token_ids=new_ids,
            cumulative_token_ids=list(self.token_ids),  # O(length): a copy per step
            finish_reason="stop" if out.done else None,
            multimodal_output={},
        )
        snapshot = {k[1]: v for k, v in self.accumulated.items() if k[0] == stage}
        if snapshot:  # MultimodalCompletionOutput: the fields again, with the snapshot
            completion = dataclasses.replace(completion, multimodal_output=snapshot)
        self._update_stats(self.stats[stage], now, len(new_ids) or 1)
        if finished:
            self.stages_done.add(stage)
        items: list[VisibleItem] = []
        if out.text:
            items.append(TextDelta(out.text))
        if out.pcm:
            items.append(AudioChunk(out.pcm, out.rate))
        return OutputMessage(
            self.request_id,
            stage,
            RequestOutput(self.request_id, self.prompt, [completion], finished),
            tuple(items),
            done_all=len(self.stages_done) == self.num_stages,
            error=out.error,
        )

    @staticmethod
    def _update_stats(stats: _Stats, now: float, num_tokens: int) -> None:
        if stats.first_token_s is None:
            stats.first_token_s = now
        elif stats.last_token_s is not None:
            stats.inter_token_s.append(now - stats.last_token_s)
        stats.last_token_s = now
        stats.num_generation_tokens += num_tokens


class _Audio(pydantic.BaseModel):
    id: str
    data: str
    expires_at: int
    transcript: str


class _Delta(pydantic.BaseModel):
    role: str | None = None
    content: str | None = None
    audio: _Audio | None = None


class _Choice(pydantic.BaseModel):
    index: int
    delta: _Delta
    finish_reason: str | None = None


class _Chunk(pydantic.BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[_Choice]


def chat_chunk_json(request_id: str, item: VisibleItem) -> str:
    """The server-sent chunk ``serving_chat`` writes for ``item``."""
    if isinstance(item, AudioChunk):
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(item.sample_rate_hz)
            wav.writeframes(item.pcm16)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        delta = _Delta(audio=_Audio(id=request_id, data=data, expires_at=0, transcript=""))
    else:
        delta = _Delta(content=item.text if isinstance(item, TextDelta) else None)
    chunk = _Chunk(
        id=f"chatcmpl-{request_id}",
        created=int(time.time()),
        model="Qwen3-Omni-30B-A3B-Instruct",
        choices=[_Choice(index=1 if isinstance(item, AudioChunk) else 0, delta=delta)],
    )
    return f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
