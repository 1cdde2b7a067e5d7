"""Qwen3-Omni thinker stage: text and audio in, text deltas out, token embeddings to the talker.

Each step: prefill the streams admitted since the last step (one at a time), then
one batched decode forward for every other active stream, then sample each row
with the stream's own parameters. That is the critical path. The rest — text
deltas, the talker's vectors — is built on the packaging thread (seed 002).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from transformers import DynamicCache, Qwen3OmniMoeThinkerForConditionalGeneration
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    _get_feat_extract_output_lengths,
)

from omnitrio import Request, StreamOutput, StreamWork, TextDelta, resample_float
from stages.kit import (
    AutoregressiveStage,
    OptionError,
    Outbox,
    Piece,
    Sampler,
    SamplingParams,
    SlotKV,
    constructor_signature,
    step_output,
)

from .fast_paths import fast_decode_forward
from .payloads import TalkerPrompt, TextToken
from .weights import ModelSource

AUDIO_INPUT_SAMPLE_RATE_HZ = 16_000


@dataclass
class _Stream:
    ids: list[int]  # prompt then answer
    num_prompt: int
    sampler: Sampler
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    audio_lengths: torch.Tensor | None = None  # [num_audios] feature frames
    kv: SlotKV | None = None  # this stream's slot in the stage's KV cache
    rope_delta: int = 0
    num_answer: int = 0
    finished: bool = False
    delivered: bool = False
    text_sent: str = ""


ENGINES = ("torch", "vllm")


class Qwen3OmniThinker(AutoregressiveStage):
    """``engine: torch`` (default): transformers' model, the stage's KV slots;
    ``engine: vllm``: ``Qwen3OmniThinkerVllm`` (thinker_vllm.py), vLLM's engine, with
    its own params (``max_num_seqs``, ``max_model_len``, ``kv_cache_bytes``, ``dtype``).

    The engine picks the class: ``__new__`` makes a ``Qwen3OmniThinkerVllm`` for
    ``engine: vllm``, and Python then runs that class's ``__init__`` with the same
    params. ``__signature__`` (set below the class) keeps this constructor's params
    visible to ``inspect.signature``, which the config checks and ``--model-path``
    read: a ``__new__`` would hide them."""

    checkpoint = "qwen3-omni"  # model_path: one folder shared with the family's other stages
    max_inputs_per_step = None
    max_payloads_per_step = 8
    max_visible_per_step = 8
    __signature__: ClassVar[inspect.Signature]  # its constructor's (below the class)

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
        decode_fast_path: str = "off",
        engine: str = "torch",
        **engine_params: Any,
    ) -> None:
        if engine not in ENGINES:
            raise OptionError(
                f"stage {name!r}: engine {engine!r} is not one of {', '.join(ENGINES)}"
            )
        if engine_params:
            raise OptionError(
                f"stage {name!r}: {', '.join(sorted(engine_params))} apply to engine: vllm only"
            )
        super().__init__(name, device, num_threads=num_threads, packaging_queue=packaging_queue)
        source = ModelSource(name, self.device, model_path, live_model)
        self.model = source.module("thinker", Qwen3OmniMoeThinkerForConditionalGeneration)
        self.decode_forward = fast_decode_forward(name, self.model, decode_fast_path)
        self.config = self.model.config
        self._read_checkpoint(source, max_tokens, system_prompt)
        self.streams: dict[str, _Stream] = {}

    def __new__(cls, *args: Any, engine: str = "torch", **params: Any) -> Qwen3OmniThinker:
        if cls is Qwen3OmniThinker and engine == "vllm":
            from .thinker_vllm import Qwen3OmniThinkerVllm

            cls = Qwen3OmniThinkerVllm  # the same stage, its critical path on vLLM
        return super().__new__(cls)

    def _read_checkpoint(self, source: ModelSource, max_tokens: int, system_prompt: str) -> None:
        """What both engines read from the checkpoint: tokenizer, features, special ids."""
        self.tokenizer = source.tokenizer()
        self.features = source.features()
        # Special ids from the composite config: a published tokenizer names them differently.
        self.eos_ids = {int(source.composite("im_end_token_id"))}
        self.defaults = SamplingParams(max_tokens=max_tokens)
        self.system_prompt = system_prompt
        self.accept_layer = int(source.composite("talker_config")["accept_hidden_layer"])
        self.im_start_id = int(source.composite("im_start_token_id"))
        self.user_id = int(source.composite("user_token_id"))
        self.special_ids = [
            int(source.composite(f"tts_{kind}_token_id")) for kind in ("bos", "eos", "pad")
        ]
        thinker = source.composite("thinker_config")
        self.audio_token_id = int(thinker["audio_token_id"])
        self.multimodal_ids = torch.tensor(
            [thinker[f"{kind}_token_id"] for kind in ("audio", "image", "video")]
        )

    # -- the stage protocol ------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        params = SamplingParams.from_options(self.defaults, request.options, self.name)
        ids, features = self._prompt(request)
        lengths = features.get("feature_attention_mask")
        self.streams[stream_id] = _Stream(
            ids,
            len(ids),
            Sampler(params, history=ids),
            features,
            None if lengths is None else lengths.sum(-1),
        )
        self.outboxes[stream_id] = Outbox()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        streams = {work.stream_id: self.streams[work.stream_id] for work in batch}
        live = {sid: s for sid, s in streams.items() if not s.finished}
        new = [sid for sid, s in live.items() if s.kv is None]
        decoding = [sid for sid, s in live.items() if s.kv is not None]
        sampled: dict[str, int] = {}
        prompts: dict[str, torch.Tensor] = {}
        for sid in new:
            logits, prompts[sid] = self._prefill(live[sid])
            sampled[sid] = self._sample(live[sid], logits)
        if decoding:
            logits = self._decode([live[sid] for sid in decoding])
            for row, sid in enumerate(decoding):
                sampled[sid] = self._sample(live[sid], logits[row])
        self.clock.end_compute()
        if sampled:
            self._package(sampled, prompts)
        return {sid: self._deliver(sid, s) for sid, s in streams.items()}

    # -- the critical path ---------------------------------------------------------

    def _prefill(self, stream: _Stream) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt; returns the last logits and the layer-0 / accept-layer states."""
        ids = torch.tensor([stream.ids], device=self.device)  # [1, S]
        mask = torch.ones_like(ids)
        audio_lengths = stream.features.get("feature_attention_mask")
        positions, deltas = self.model.get_rope_index(
            ids,
            None,
            None,
            mask,
            False,
            None if audio_lengths is None else audio_lengths.sum(-1),
            None,
        )
        text_positions = torch.arange(ids.shape[1], device=self.device).view(1, 1, -1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=torch.cat((text_positions, positions)),  # [4, 1, S]
            past_key_values=DynamicCache(),
            use_cache=True,
            output_hidden_states=True,
            **stream.features,
        )
        stream.kv = self.kv_slots.adopt(out.past_key_values)
        stream.rope_delta = int(deltas[0, 0])
        stream.features = {}
        # states: [2, S, H] — layer 0 (embeddings, audio merged) and the accept layer
        states = torch.stack((out.hidden_states[0][0], out.hidden_states[self.accept_layer][0]))
        return out.logits[0, -1].float().cpu(), states

    def _decode(self, streams: list[_Stream]) -> torch.Tensor:
        """One forward for every decoding stream; returns logits [B, V]."""
        kvs = [s.kv for s in streams if s.kv is not None]
        tokens = torch.tensor([[s.ids[-1]] for s in streams], device=self.device)  # [B, 1]
        positions = torch.tensor(
            [[kv.length + s.rope_delta] for kv, s in zip(kvs, streams, strict=True)],
            device=self.device,
        ).view(1, -1, 1)  # [1, B, 1]
        out, rows = self.kv_slots.decode(self.decode_forward, kvs, positions, input_ids=tokens)
        return out.logits[rows, -1].float().cpu()  # one device -> host copy per step

    def _sample(self, stream: _Stream, logits: torch.Tensor) -> int:
        started = time.perf_counter()
        token = stream.sampler.pick(logits)
        stream.ids.append(token)
        stream.num_answer += 1
        stream.finished = (
            token in self.eos_ids or stream.num_answer >= stream.sampler.params.max_tokens
        )
        if stream.finished and stream.kv is not None:
            stream.kv.release()  # no more decoding: the slot goes to the next stream
        self.clock.add_sampling(time.perf_counter() - started)
        return token

    # -- off the critical path -------------------------------------------------------

    def _package(self, sampled: dict[str, int], prompts: dict[str, torch.Tensor]) -> None:
        jobs = [
            (sid, stream, len(stream.ids), stream.finished, prompts.get(sid))
            for sid, stream in ((sid, self.streams[sid]) for sid in sampled)
        ]
        self.packager.submit(tuple(sampled), lambda: {j[0]: self._pack(*j[1:]) for j in jobs})

    def _pack(
        self, stream: _Stream, length: int, last: bool, prompt_states: torch.Tensor | None
    ) -> Piece:
        ids = stream.ids[:length]
        index = length - stream.num_prompt - 1  # answer token index
        if prompt_states is not None:
            payload: object = self._talker_prompt(stream, ids, prompt_states, last)
        elif last:
            payload = TextToken(index, torch.empty(0, device=self.device), last=True)
        else:
            payload = TextToken(index, self._embed(ids[-1]), last=False)
        visible: tuple[TextDelta, ...] = ()
        text = self.tokenizer.decode(ids[stream.num_prompt :], skip_special_tokens=True)
        if not text.endswith("\ufffd") or last:  # hold back half a UTF-8 character
            delta, stream.text_sent = text[len(stream.text_sent) :], text
            visible = (TextDelta(delta),) if delta else ()
        return Piece((payload,), visible)

    def _talker_prompt(
        self, stream: _Stream, ids: list[int], states: torch.Tensor, last: bool
    ) -> TalkerPrompt:
        """On the thinker's device: the talker reads it there when it shares the device."""
        prompt = torch.tensor(ids[:-1])  # [S], on the host: index bookkeeping only
        user = _user_positions(prompt, self.im_start_id, self.user_id)  # [U]
        user_ids = prompt[user].to(self.device)  # [U]
        multimodal = torch.isin(prompt[user], self.multimodal_ids).to(self.device)  # [U]
        user = user.to(self.device)
        vectors = torch.where(multimodal[:, None], states[1][user], states[0][user])  # [U, H]
        first = [] if last else [self._embed(ids[-1])[None]]
        return TalkerPrompt(
            user_vectors=vectors,
            user_multimodal=multimodal,
            user_ids=user_ids,
            audio_feature_lengths=stream.audio_lengths,  # on the device with the features
            assistant_vectors=torch.cat((states[0][-3:], *first)),
            special_vectors=self._embed_many(self.special_ids),
            first_is_last=last,
        )

    def _embed(self, token: int) -> torch.Tensor:
        return self._embed_many([token])[0]

    def _embed_many(self, tokens: list[int]) -> torch.Tensor:
        """Token embeddings [N, H], on the thinker's device."""
        with torch.no_grad():
            return self.model.get_input_embeddings()(torch.tensor(tokens, device=self.device))

    def _deliver(self, stream_id: str, stream: _Stream) -> StreamOutput:
        return step_output(
            self.packager,
            stream_id,
            self.outboxes[stream_id],
            computing=not stream.finished,
            can_continue=True,
            max_payloads=self.max_payloads_per_step,
        )

    # -- prompts -------------------------------------------------------------------

    def _waveform(self, request: Request) -> np.ndarray | None:
        """The request's audio as float32 at the encoder's 16 kHz, if it has audio."""
        if request.audio is None:
            return None
        pcm = np.frombuffer(request.audio.pcm16, dtype="<i2").astype(np.float32) / 32768.0
        return resample_float(pcm, request.audio.sample_rate_hz, AUDIO_INPUT_SAMPLE_RATE_HZ)

    def _prompt(self, request: Request) -> tuple[list[int], dict[str, torch.Tensor]]:
        """Token ids of the chat prompt and, for audio input, the encoder's features
        (of ``_waveform``)."""
        content, features = request.text, {}
        wave = self._waveform(request)
        if wave is not None:
            extracted = self.features(
                wave,
                sampling_rate=AUDIO_INPUT_SAMPLE_RATE_HZ,
                padding="longest",
                return_attention_mask=True,
                return_tensors="pt",
            )
            mask = extracted["attention_mask"]  # [1, frames]
            num_audio = int(_get_feat_extract_output_lengths(mask.sum(-1))[0])
            content = "<|audio_start|>" + "<|audio_pad|>" * num_audio + "<|audio_end|>" + content
            features = {
                "input_features": extracted["input_features"].to(self.device),
                "feature_attention_mask": mask.to(self.device),
            }
        messages = [{"role": "user", "content": content}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer(text)["input_ids"]), features


Qwen3OmniThinker.__signature__ = constructor_signature(Qwen3OmniThinker)


def _user_positions(prompt: torch.Tensor, im_start_id: int, user_id: int) -> torch.Tensor:
    """Positions of the prompt inside user turns, as the reference talker input takes them."""
    positions = torch.arange(len(prompt))
    starts = torch.where(prompt == im_start_id, positions, torch.full_like(positions, -1))
    previous_start = torch.cummax(starts, dim=0).values.clamp_min(0)
    roles = prompt[(previous_start + 1).clamp_max(len(prompt) - 1)]
    return positions[roles == user_id]
