"""Qwen3-Omni talker stage: thinker token embeddings in, codec frames out.

The talker starts a stream as soon as the thinker's first answer token arrives
(seed 004): its prefill needs the prompt's user part, ``<|im_start|>assistant\\n``
and that first token. Each later step g reads text entry g — the embedding of
answer token g + 1, ``tts_eos`` for the thinker's final token, ``tts_pad`` after
it — so a stream whose next text entry has not arrived yet simply waits.

One step: prefill new streams (one at a time); then for every other ready stream,
batched: the code predictor draws the residual code groups of the previous
frame, the frame goes out, and one talker forward samples the next group-0 code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache, Qwen3OmniMoeTalkerForConditionalGeneration

from omnitrio import Request, ResponseOptions, StreamOutput, StreamWork
from stages.kit import (
    AutoregressiveStage,
    OptionError,
    Outbox,
    Piece,
    Sampler,
    SamplingParams,
    SlotKV,
    on,
    step_output,
)

from .fast_paths import fast_decode_forward
from .payloads import CodecFrame, TalkerPrompt, TextToken
from .weights import ModelSource

# generate(return_audio=True)'s talker defaults.
TALKER_DEFAULTS = SamplingParams(
    temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, max_tokens=4096
)


@dataclass
class _Stream:
    sampler: Sampler
    residual_sampler: Sampler
    speaker_id: int
    prompt: TalkerPrompt | None = None
    text: list[torch.Tensor] = field(default_factory=list)  # projected entries 0, 1, ...
    text_complete: bool = False
    kv: SlotKV | None = None  # this stream's slot in the stage's KV cache
    rope_delta: int = 0
    codes: list[int] = field(default_factory=list)  # group-0 codes sampled so far
    last_hidden: torch.Tensor | None = None  # [H] talker output at the last position
    finished: bool = False


class Qwen3OmniTalker(AutoregressiveStage):
    checkpoint = "qwen3-omni"  # model_path: one folder shared with the family's other stages
    max_inputs_per_step = None
    max_payloads_per_step = 4
    max_visible_per_step = 0

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str | None = None,
        live_model: str | None = None,
        max_frames: int = 1024,
        speaker: str = "ethan",
        num_threads: int | None = None,
        packaging_queue: int = 4,
        decode_fast_path: str = "off",
    ) -> None:
        super().__init__(name, device, num_threads=num_threads, packaging_queue=packaging_queue)
        source = ModelSource(name, self.device, model_path, live_model)
        self.model = source.module("talker", Qwen3OmniMoeTalkerForConditionalGeneration)
        self.decode_forward = fast_decode_forward(name, self.model, decode_fast_path)
        self.config = self.model.config
        self.embed = self.model.get_input_embeddings()
        self.residual_embeds = self.model.code_predictor.get_input_embeddings()
        vocab = self.config.text_config.vocab_size
        self.eos_id = self.config.codec_eos_token_id
        self.suppress_ids = [i for i in range(vocab - 1024, vocab) if i != self.eos_id]
        self.defaults = replace(TALKER_DEFAULTS, max_tokens=max_frames)
        self.default_speaker = speaker
        self.tts_pad_token_id = int(source.composite("tts_pad_token_id"))
        self.streams: dict[str, _Stream] = {}

    # -- the stage protocol ------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        # The talker keeps its own sampling keys (``talker.<key>``), but a request's
        # ``seed`` (OpenAI's) seeds it too: the same seed, the same answer, audio included.
        seed = request.options.seed
        defaults = self.defaults
        if seed is not None:
            defaults = replace(defaults, seed=seed)
        params = SamplingParams.from_options(defaults, request.options, self.name, inherit=False)
        speaker = self._speaker(request.options)
        # The code predictor samples (top-k 50, top-p 0.8) exactly when the talker does.
        residual = SamplingParams(
            temperature=1.0 if params.temperature > 0 else 0.0,
            top_k=50,
            top_p=0.8,
            seed=params.seed,
        )
        self.streams[stream_id] = _Stream(
            Sampler(params, suppress=self.suppress_ids),
            Sampler(residual),
            self.config.speaker_id[speaker],
        )
        if not request.options.wants("audio"):
            self.streams[stream_id].finished = True  # a text-only answer: no talker work
        self.outboxes[stream_id] = Outbox()

    def _speaker(self, options: ResponseOptions) -> str:
        """The knob ``speaker`` must name one of the model's speakers; an OpenAI ``voice``
        (alloy, ...) that is not one of them gets the default speaker."""
        known = self.config.speaker_id
        if options.knobs.get("speaker") is not None:
            speaker = str(options.knobs["speaker"]).lower()
            if speaker not in known:
                raise OptionError(
                    f"unknown speaker {speaker!r}; this model has: {', '.join(sorted(known))}"
                )
            return speaker
        voice = (options.voice or "").lower()
        return voice if voice in known else self.default_speaker

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        streams = {work.stream_id: self.streams[work.stream_id] for work in batch}
        for work in batch:
            self._receive(streams[work.stream_id], work.inputs)
        frames: dict[str, list[torch.Tensor]] = {}  # at most one frame per stream
        with torch.no_grad():
            for s in streams.values():
                if not s.finished and s.kv is None and s.prompt is not None:
                    self._prefill(s)
            ready = [sid for sid, s in streams.items() if _ready(s) and s.codes]
            if ready:
                for sid, frame in zip(
                    ready, self._decode([streams[i] for i in ready]), strict=True
                ):
                    frames[sid] = [frame]
        self.clock.end_compute()
        if frames:
            self.packager.submit(
                tuple(frames),
                lambda: {
                    sid: Piece(tuple(CodecFrame(f) for f in fs)) for sid, fs in frames.items()
                },
            )
        return {sid: self._deliver(sid, s) for sid, s in streams.items()}

    # -- inputs ----------------------------------------------------------------------

    def _receive(self, stream: _Stream, inputs: tuple[object, ...]) -> None:
        project = self.model.text_projection
        with torch.no_grad():
            for item in inputs:
                if isinstance(item, TalkerPrompt):
                    stream.prompt = item
                    stream.text_complete = item.first_is_last
                    self.special = project(on(item.special_vectors, self.device))  # [3, H]
                elif isinstance(item, TextToken):
                    if item.last:
                        stream.text.append(self.special[1])  # tts_eos
                        stream.text_complete = True
                    else:
                        stream.text.append(project(on(item.vector, self.device)))

    # -- the critical path ---------------------------------------------------------

    def _prefill(self, stream: _Stream) -> None:
        prompt = stream.prompt
        assert prompt is not None
        embeds, talker_ids, audio_lengths = self._prompt_embeds(stream, prompt)  # [1, L, H]
        mask = torch.ones(talker_ids.shape, dtype=torch.long, device=self.device)
        self.model.rope_deltas = None
        positions = self.model.compute_3d_position_ids(
            embeds,
            talker_input_ids=talker_ids,
            attention_mask=mask,
            audio_feature_lengths=audio_lengths,
        )
        stream.rope_delta = int(self.model.rope_deltas[0, 0])
        out = self.model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=DynamicCache(),
            use_cache=True,
            output_hidden_states=True,
        )
        stream.kv = self.kv_slots.adopt(out.past_key_values)
        stream.last_hidden = out.hidden_states[0][-1][0, -1]
        self._sample(stream, out.logits[0, -1].float().cpu())

    def _prompt_embeds(
        self, stream: _Stream, prompt: TalkerPrompt
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The prefill input, as the reference builds it: user part, then assistant part."""
        vectors = on(prompt.user_vectors, self.device)
        user = torch.where(
            on(prompt.user_multimodal, self.device)[:, None],
            self.model.hidden_projection(vectors),
            self.model.text_projection(vectors),
        )  # [U, H]
        assistant = self.model.text_projection(
            on(prompt.assistant_vectors, self.device)
        )  # [3|4, H]
        bos, _, pad = self.special
        first_text = assistant[3:4] if len(assistant) > 3 else self.special[1:2]
        text_part = torch.cat((assistant[:3], pad.expand(4, -1), bos[None], first_text))  # [9, H]
        codec_ids = torch.tensor(
            [
                self.config.codec_nothink_id,
                self.config.codec_think_bos_id,
                self.config.codec_think_eos_id,
                stream.speaker_id,
                self.config.codec_pad_id,
                self.config.codec_bos_id,
            ],
            device=self.device,
        )
        codec_part = torch.cat((torch.zeros_like(text_part[:3]), self.embed(codec_ids)))  # [9, H]
        embeds = torch.cat((user, text_part + codec_part))[None]  # [1, U + 9, H]
        assistant_ids = torch.full((9,), self.tts_pad_token_id, device=self.device)
        talker_ids = torch.cat((on(prompt.user_ids, self.device), assistant_ids))[None]
        lengths = prompt.audio_feature_lengths
        return embeds, talker_ids, None if lengths is None else on(lengths, self.device)

    def _decode(self, streams: list[_Stream]) -> list[torch.Tensor]:
        """Finish each stream's previous frame and sample its next group-0 code."""
        last_codes = torch.tensor([[s.codes[-1]] for s in streams], device=self.device)  # [B, 1]
        residuals = self._residual_codes(streams, last_codes)  # [B, G - 1]
        frames = torch.cat((last_codes, residuals), dim=1)  # [B, G]
        embeds = self.embed(last_codes)[:, 0] + sum(
            self.residual_embeds[i](residuals[:, i]) for i in range(residuals.shape[1])
        )  # [B, H]
        text = torch.stack([self._text_entry(s) for s in streams])  # [B, H]
        kvs = [s.kv for s in streams if s.kv is not None]
        positions = (
            torch.tensor(
                [kv.length + s.rope_delta for kv, s in zip(kvs, streams, strict=True)],
                device=self.device,
            )
            .view(1, -1, 1)
            .expand(3, -1, -1)
        )  # [3, B, 1]
        out, rows = self.kv_slots.decode(
            self.decode_forward,
            kvs,
            positions,
            inputs_embeds=(embeds + text)[:, None],
            output_hidden_states=True,
            generation_step=0,  # the talker's own text bookkeeping, unused here
        )
        logits = out.logits[rows, -1].float().cpu()  # one device -> host copy per step
        for index, (row, stream) in enumerate(zip(rows, streams, strict=True)):
            stream.last_hidden = out.hidden_states[0][-1][row, -1]
            self._sample(stream, logits[index])
        return list(frames)  # on the device: code2wav reads them there when it shares it

    def _residual_codes(self, streams: list[_Stream], last_codes: torch.Tensor) -> torch.Tensor:
        """The code predictor's groups 1 .. G-1 for each stream's last group-0 code."""
        predictor = self.model.code_predictor
        hidden = torch.stack([s.last_hidden for s in streams])[:, None]  # [B, 1, H]
        embeds = torch.cat((hidden, self.embed(last_codes)), dim=1)  # [B, 2, H]
        cache = DynamicCache()
        out = predictor(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
        codes = []
        for group in range(1, self.config.num_code_groups):
            logits = out.logits[:, -1].float().cpu()  # [B, codebook]
            picked = [s.residual_sampler.pick(logits[row]) for row, s in enumerate(streams)]
            codes.append(picked)
            if group < self.config.num_code_groups - 1:
                tokens = torch.tensor(picked, device=self.device)[:, None]  # [B, 1]
                out = predictor(
                    input_ids=tokens, generation_steps=group, past_key_values=cache, use_cache=True
                )
        return torch.tensor(codes, device=self.device).T  # [B, G - 1]

    def _text_entry(self, stream: _Stream) -> torch.Tensor:
        index = len(stream.codes) - 1  # generation step since the prefill
        if index < len(stream.text):
            return stream.text[index]
        return self.special[2]  # tts_pad once the text has run out

    def _sample(self, stream: _Stream, logits: torch.Tensor) -> None:
        started = time.perf_counter()
        code = stream.sampler.pick(logits)
        self.clock.add_sampling(time.perf_counter() - started)
        if code != self.eos_id:
            stream.codes.append(code)
        # As generate: the last of max_tokens codes ends the stream without a frame.
        stream.finished = (
            code == self.eos_id or len(stream.codes) >= stream.sampler.params.max_tokens
        )
        if stream.finished and stream.kv is not None:
            stream.kv.release()  # no more decoding: the slot goes to the next stream

    def _deliver(self, stream_id: str, stream: _Stream) -> StreamOutput:
        return step_output(
            self.packager,
            stream_id,
            self.outboxes[stream_id],
            computing=not stream.finished,
            can_continue=_ready(stream),  # else it waits for the thinker's next token
            max_payloads=self.max_payloads_per_step,
        )


def _ready(stream: _Stream) -> bool:
    """Prefilled, not finished, and the text entry for the next step is known."""
    if stream.kv is None or stream.finished:
        return False
    return stream.text_complete or len(stream.codes) - 1 < len(stream.text)
