"""The Qwen3-Omni thinker on vLLM (``engine: vllm`` in the thinker's params).

The same stage as ``Qwen3OmniThinker`` — the same prompts, the same text deltas and
talker payloads, packaged off the critical path — with the critical path on vLLM's
``LLMEngine`` (``stages.kit.VllmEngine``: the engine in a process of its own):

- ``open_stream``: the prompt's ids go to the engine (``add``) at once; a request
  vLLM refuses fails that stream alone.
- a step: one engine step when a stream of the batch is waiting for a token; then
  each stream of the batch takes one token (the one ``step`` a torch thinker makes).
- ``close_stream`` (closed, cancelled, failed): the engine's request is aborted.

Backpressure: the engine steps every request it holds, whether or not the runtime
put its stream in this round's batch. What it makes ahead for a stream held back is
kept as token ids in the stream's own buffer (at most its ``max_tokens``, 4 bytes a
token); the costly part (detokenizing, the talker's vectors) is made only when the
stream steps, so downstream pressure still paces everything a stream sends.

The talker's prompt needs the prompt's layer-0 and accept-layer hidden states: the
engine returns them once per request through forward hooks on vLLM's decoder layers
(``stages/_vllm_worker.py``, checked against vLLM 0.32.0's internals). Token
embeddings come from the checkpoint's embedding matrix, loaded alone.

Sampling is vLLM's: ``temperature``, ``top_p``, ``top_k``, ``seed`` and
``repetition_penalty`` (over the prompt's and the answer's tokens, as transformers'
``generate`` and the torch thinker apply it).

Audio input (``audio_input``, on by default) goes through vLLM's multimodal path, as
on the Qwen2.5-Omni vLLM thinker: the prompt's run of ``<|audio_pad|>`` is given as one,
with the 16 kHz waveform the torch thinker's features are made from, and vLLM's
processor (the checkpoint's ``Qwen3OmniMoeProcessor``, built from its top folder's
``processor_config.json`` and tokenizer) makes the features and expands the
placeholder again; the engine runs its own audio encoder, and the layer-0 states the
talker reads at the audio positions are the encoder's, merged. The stage checks that
the engine ran the prompt at the stage's own length. Off, an audio request fails with
an ``OptionError`` naming ``engine: torch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from omnitrio import Request, StreamOutput, StreamWork
from stages.kit import (
    AutoregressiveStage,
    OptionError,
    Outbox,
    Sampler,
    SamplingParams,
    VllmEngine,
    VllmEngineStage,
    check_prompt_rows,
    constructor_signature,
    load_embedding,
    one_placeholder,
)

from .thinker import AUDIO_INPUT_SAMPLE_RATE_HZ, Qwen3OmniThinker, _Stream
from .weights import ModelSource

HIDDEN_LAYER_FIRST = 0


@dataclass
class _EngineStream(_Stream):
    pending: list[int] = field(default_factory=list)  # made by the engine, not yet taken
    engine_done: bool = False  # the engine has finished the request
    prompt_states: torch.Tensor | None = None  # [2, S, H] until the first token is packaged


class Qwen3OmniThinkerVllm(VllmEngineStage, Qwen3OmniThinker):
    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str | None = None,
        live_model: str | None = None,
        max_tokens: int = 256,
        system_prompt: str = "",
        num_threads: int | None = None,
        packaging_queue: int = 4,
        max_num_seqs: int = 32,
        max_model_len: int = 4096,
        kv_cache_bytes: int = 1 << 30,
        dtype: str = "float32",
        audio_input: bool = True,
        engine: str = "vllm",
    ) -> None:
        if engine != "vllm":
            raise OptionError(f"stage {name!r}: this is the thinker on engine: vllm, not {engine}")
        AutoregressiveStage.__init__(
            self, name, device, num_threads=num_threads, packaging_queue=packaging_queue
        )
        if live_model is not None or model_path is None:
            raise OptionError(f"stage {name!r}: engine: vllm loads a model_path folder only")
        source = ModelSource(name, self.device, model_path, None)
        self._read_checkpoint(source, max_tokens, system_prompt)
        self.embeddings = load_embedding(
            f"{model_path}/thinker", "model.embed_tokens.weight", self.device
        )
        self.streams: dict[str, _EngineStream] = {}  # type: ignore[assignment]
        self.engine = VllmEngine.start(
            model_path,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            kv_cache_bytes=kv_cache_bytes,
            dtype=dtype,  # bfloat16 on a GPU
            hidden_layers=[HIDDEN_LAYER_FIRST, self.accept_layer],
            audio=audio_input,
        )
        self.audio_input = audio_input

    # -- the stage protocol ------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        if request.audio is not None and not self.audio_input:
            raise OptionError(
                f"stage {self.name!r}: audio input is off here (audio_input: false); "
                "use engine: torch or audio_input: true for audio requests"
            )
        params = SamplingParams.from_options(self.defaults, request.options, self.name)
        ids, features = self._prompt(request)
        prompt, audio = ids, None
        wave = self._waveform(request)
        if wave is not None:  # the waveform the torch thinker's features come from
            prompt = one_placeholder(ids, self.audio_token_id)
            audio = (wave, AUDIO_INPUT_SAMPLE_RATE_HZ)
        self.add_request(
            stream_id, prompt, params, sorted(self.eos_ids), prompt_states=True, audio=audio
        )
        lengths = features.get("feature_attention_mask")
        self.streams[stream_id] = _EngineStream(
            ids,
            len(ids),
            Sampler(params, history=ids),
            audio_lengths=None if lengths is None else lengths.sum(-1),
        )
        self.outboxes[stream_id] = Outbox()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        streams = self.engine_round(batch)
        sampled: dict[str, int] = {}
        prompts: dict[str, torch.Tensor] = {}
        for sid, stream in streams.items():
            if stream.engine_done and not stream.pending:
                stream.finished = True  # the engine ended it with no token left to give
            if stream.finished or not stream.pending:
                continue
            token = stream.pending.pop(0)
            stream.ids.append(token)
            stream.num_answer += 1
            stream.finished = (
                token in self.eos_ids
                or stream.num_answer >= stream.sampler.params.max_tokens
                or (stream.engine_done and not stream.pending)
            )
            sampled[sid] = token
            if stream.prompt_states is not None:
                check_prompt_rows(self.name, stream.prompt_states.shape[1], stream.num_prompt)
                prompts[sid], stream.prompt_states = stream.prompt_states, None
        self.clock.end_compute()
        if sampled:
            self._package(sampled, prompts)
        return {sid: self._deliver(sid, s) for sid, s in streams.items()}

    def _engine_step(self) -> None:
        for out in self.engine.step():
            stream = self.streams.get(out.request_id)
            if stream is None:
                continue  # closed meanwhile
            stream.pending.extend(out.new_token_ids)
            stream.engine_done = out.finished
            if out.states is not None:
                stream.prompt_states = torch.from_numpy(out.states.copy()).to(self.device)

    def _embed_many(self, tokens: list[int]) -> torch.Tensor:
        return self.embeddings[torch.tensor(tokens, device=self.device)]

    def stage_statistics(self) -> Mapping[str, float]:
        return self.engine_statistics()


Qwen3OmniThinkerVllm.__signature__ = constructor_signature(Qwen3OmniThinkerVllm)
