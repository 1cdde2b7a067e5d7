"""The thinker: prompt (text and audio) -> text tokens, streamed to the talker as it goes.

Each step: prefill the streams that just arrived (one forward each), then one
batched decode forward for every stream with a token to feed back; sample; store
the sampled tokens for the next step (the critical path ends here); hand the
rest — hidden-state slicing for the talker, detokenization — to the packaging
thread. See ``_payloads.py`` for what goes to the talker.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import (
    AutoTokenizer,
    DynamicCache,
    GenerationConfig,
    Qwen2_5OmniTalkerConfig,
    Qwen2_5OmniThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)

from omnitrio import (
    Event,
    Request,
    StepLimits,
    StreamOutput,
    StreamWork,
    TextDelta,
    VisibleItem,
)
from stages.kit import (
    AutoregressiveStage,
    Detokenizer,
    OptionError,
    Outbox,
    Piece,
    Sampler,
    SamplingParams,
    SlotKV,
    constructor_signature,
    on,
    step_output,
)

from .loading import load_speakers, load_stage_model, speaker_of, stage_folder
from .payloads import ReplyEnd, ReplyStart, ReplyToken
from .prompt import Prompt, build_prompt
from .stats import DecodeBatches


@dataclass
class _Stream:
    prompt: Prompt
    sampler: Sampler
    speaker: str
    detok: Detokenizer
    kv: SlotKV | None = None  # this stream's slot in the stage's KV cache
    next_token: int | None = None  # sampled, to be fed back at the next step
    num_generated: int = 0
    finished: bool = False  # the last token is sampled


TEXT_IDS_EVENT = "thinker.text_ids"
ENGINES = ("torch", "vllm")


class Qwen2_5OmniThinker(AutoregressiveStage):
    """The Qwen2.5-Omni thinker as an omnitrio stage (see the module docstring).

    ``emit_ids``: also send each sampled token id to the client as an
    ``Event("thinker.text_ids", {"ids": [...]})`` (for parity checks and tracing).

    ``engine: torch`` (default): transformers' model, the stage's KV slots; ``engine:
    vllm``: ``Qwen2_5OmniThinkerVllm`` (thinker_vllm.py), vLLM's engine, with its own
    params. ``__new__`` picks the class, and ``__signature__`` (below the class) keeps
    this constructor's params visible to ``inspect.signature``.
    """

    checkpoint = "qwen2.5-omni"  # model_path: one folder shared with the family's other stages
    max_inputs_per_step: int | None = None
    max_payloads_per_step = 4
    max_visible_per_step: int
    __signature__: ClassVar[inspect.Signature]  # its constructor's (below the class)

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits:
        """What one step emits with these params (the config is checked by it)."""
        emit_ids = params.get("emit_ids", False)  # a subclass may pass it on in **kwargs
        if not isinstance(emit_ids, bool):
            raise TypeError(f"emit_ids must be true or false, got {emit_ids!r}")
        return StepLimits(cls.max_payloads_per_step, 2 if emit_ids else 1)

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        speaker: str = "Chelsie",
        system_prompt: str | None = None,
        emit_ids: bool = False,
        num_threads: int | None = None,
        packaging_queue: int = 8,
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
        folder = stage_folder(model_path, "thinker")
        model = load_stage_model(Qwen2_5OmniThinkerForConditionalGeneration, folder, name)
        self.model = model.to(self.device)
        self._read_checkpoint(
            model_path,
            self.model.get_input_embeddings().weight,
            _eos_ids(self.model.generation_config),
            SamplingParams(temperature, top_p, top_k, repetition_penalty, max_tokens, seed),
            speaker,
            system_prompt,
            emit_ids,
        )
        self.audio_token_id = self.model.config.audio_token_index
        self.batches = DecodeBatches()

    def __new__(cls, *args: Any, engine: str = "torch", **params: Any) -> Qwen2_5OmniThinker:
        if cls is Qwen2_5OmniThinker and engine == "vllm":
            from .thinker_vllm import Qwen2_5OmniThinkerVllm

            cls = Qwen2_5OmniThinkerVllm  # the same stage, its critical path on vLLM
        return super().__new__(cls)

    def _read_checkpoint(
        self,
        model_path: str,
        embeddings: torch.Tensor,
        eos_token_ids: frozenset[int],
        defaults: SamplingParams,
        speaker: str,
        system_prompt: str | None,
        emit_ids: bool,
    ) -> None:
        """What both engines read from the checkpoint: tokenizer, features, speakers, the
        talker's special text embeddings (``embeddings``: the token embedding matrix)."""
        folder = stage_folder(model_path, "thinker")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.features = WhisperFeatureExtractor.from_pretrained(folder)
        self.speakers = load_speakers(folder, self.name)
        talker = Qwen2_5OmniTalkerConfig.from_pretrained(stage_folder(model_path, "talker"))
        self.defaults = defaults
        self.defaults.check()
        self.default_speaker = speaker_of(speaker, self.speakers, speaker)
        self.system_prompt = system_prompt
        self.emit_ids = emit_ids
        self.max_visible_per_step = self.step_limits({"emit_ids": emit_ids}).max_visible_per_step
        self.eos_token_ids = eos_token_ids
        with torch.no_grad():
            ids = [talker.tts_text_end_token_id, talker.tts_text_pad_token_id]
            self._text_eos, self._text_pad = embeddings[ids].to(self.device).unbind(0)  # [D]
            self._text_bos = {
                speaker_name: embeddings[int(spk["bos_token"])].to(self.device)
                for speaker_name, spk in self.speakers.items()
            }
        self.streams: dict[str, _Stream] = {}

    # ----- the stage protocol ---------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        prompt = _on_device(
            build_prompt(request, self.tokenizer, self.features, self.system_prompt), self.device
        )
        params = SamplingParams.from_options(self.defaults, request.options, self.name)
        speaker = speaker_of(
            request.options.knobs.get("speaker"), self.speakers, self.default_speaker
        )
        sampler = Sampler(params, prompt.input_ids[0].tolist())
        self.streams[stream_id] = _Stream(prompt, sampler, speaker, Detokenizer(self.tokenizer))
        self.outboxes[stream_id] = Outbox()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        ids = [w.stream_id for w in batch]
        for sid in ids:
            if self.streams[sid].kv is None:
                self._prefill(sid)
        decoding = [sid for sid in ids if self.streams[sid].next_token is not None]
        decoding = [sid for sid in decoding if not self.streams[sid].finished]
        if decoding:
            self._decode(decoding)
        self.batches.record(len(decoding))
        self.clock.end_compute()
        return {sid: self._output(sid) for sid in ids}

    def stage_statistics(self) -> Mapping[str, float]:
        return {**super().stage_statistics(), **self.batches.snapshot()}

    # ----- the critical path ------------------------------------------------------------

    def _prefill(self, sid: str) -> None:
        stream = self.streams[sid]
        prompt = stream.prompt
        length = prompt.input_ids.shape[1]
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        positions = torch.arange(length, device=self.device)
        positions = positions.view(1, 1, length).expand(4, 1, length)  # [4, 1, L]
        extra: dict[str, Any] = {}
        if prompt.input_features is not None:
            extra = {
                "input_features": prompt.input_features,
                "feature_attention_mask": prompt.feature_attention_mask,
            }
        out = self.model(
            input_ids=prompt.input_ids,
            attention_mask=torch.ones(1, length, dtype=torch.long, device=self.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
            **extra,
        )
        stream.kv = self.kv_slots.adopt(cache)
        news = self._sample({sid: out.logits[0, -1]})
        embeds, last = out.hidden_states[0], out.hidden_states[-1]  # [1, L, D] each
        start = self._reply_start
        self.packager.submit((sid,), lambda: {sid: start(sid, embeds, last, news[sid])})

    def _decode(self, sids: list[str]) -> None:
        streams = [self.streams[sid] for sid in sids]
        kvs = [s.kv for s in streams if s.kv is not None]
        tokens = torch.tensor([[s.next_token] for s in streams], device=self.device)  # [B, 1]
        positions = torch.tensor([kv.length for kv in kvs], device=self.device)  # [B]
        positions = positions.view(1, -1, 1).expand(4, -1, 1)  # [4, B, 1]
        out, rows = self.kv_slots.decode(
            self.model, kvs, positions, input_ids=tokens, output_hidden_states=True
        )
        news = self._sample({sid: out.logits[row, -1] for row, sid in zip(rows, sids, strict=True)})
        embeds, last = out.hidden_states[0], out.hidden_states[-1]  # [B, 1, D] each
        token = self._reply_token
        self.packager.submit(
            tuple(sids),
            lambda: {
                sid: token(sid, embeds[row, 0], last[row, 0], news[sid])
                for row, sid in zip(rows, sids, strict=True)
            },
        )

    def _sample(self, logits: dict[str, torch.Tensor]) -> dict[str, _News]:
        """Pick each stream's next token and store it: all the next step needs."""
        sampling_started = time.perf_counter()
        news = {}
        for sid, row in logits.items():
            stream = self.streams[sid]
            token = stream.sampler.pick(row.float())
            stream.num_generated += 1
            stream.next_token = token
            stream.finished = (
                token in self.eos_token_ids
                or stream.num_generated >= stream.sampler.params.max_tokens
            )
            if stream.finished and stream.kv is not None:
                stream.kv.release()  # no more decoding: the slot goes to the next stream
            news[sid] = _News(token, stream.finished, stream.num_generated)
        self.clock.add_sampling(time.perf_counter() - sampling_started, len(logits))
        return news

    # ----- packaging (on the packaging thread) -----------------------------------------

    def _reply_start(
        self, sid: str, embeds: torch.Tensor, last: torch.Tensor, news: _News
    ) -> Piece:
        stream = self.streams.get(sid)
        if stream is None:
            return Piece()
        input_ids = stream.prompt.input_ids[0]  # [L]
        prompt_embeds = embeds[0].clone()  # [L, D]
        prompt_embeds[input_ids == self.audio_token_id] = 0.0  # as generate() does
        start = ReplyStart(
            prompt=last[0] + prompt_embeds,
            text_bos=self._text_bos[stream.speaker],
            text_eos=self._text_eos,
            text_pad=self._text_pad,
        )
        return self._with_news(stream, (start,), news)

    def _reply_token(self, sid: str, embed: torch.Tensor, last: torch.Tensor, news: _News) -> Piece:
        stream = self.streams.get(sid)
        if stream is None:
            return Piece()
        return self._with_news(stream, (ReplyToken(last + embed),), news)

    def _with_news(self, stream: _Stream, payloads: tuple[object, ...], news: _News) -> Piece:
        """Add the newly sampled token's text and, after the last token, ``ReplyEnd``."""
        text = stream.detok.add(news.token, final=news.final)
        if news.final:
            payloads += (ReplyEnd(news.num_generated),)
        visible: tuple[VisibleItem, ...] = (TextDelta(text),) if text else ()
        if self.emit_ids:
            visible += (Event(TEXT_IDS_EVENT, {"ids": (news.token,)}),)
        return Piece(payloads, visible)

    def _output(self, sid: str) -> StreamOutput:
        stream = self.streams[sid]
        return step_output(
            self.packager,
            sid,
            self.outboxes[sid],
            computing=not stream.finished,
            can_continue=not stream.finished,
            max_payloads=self.max_payloads_per_step,
        )


Qwen2_5OmniThinker.__signature__ = constructor_signature(Qwen2_5OmniThinker)


@dataclass(frozen=True, slots=True)
class _News:
    """What the packaging of one step needs to know of a stream's sampled token."""

    token: int
    final: bool
    num_generated: int


def _on_device(prompt: Prompt, device: torch.device) -> Prompt:
    features, mask = prompt.input_features, prompt.feature_attention_mask
    return Prompt(
        on(prompt.input_ids, device),
        None if features is None else on(features, device),
        None if mask is None else on(mask, device),
    )


def _eos_ids(generation_config: GenerationConfig) -> frozenset[int]:
    eos = generation_config.eos_token_id
    if eos is None:
        raise ValueError("the thinker's generation_config has no eos_token_id")
    return frozenset([eos] if isinstance(eos, int) else eos)
