"""The talker: the thinker's reply, token by token -> codec codes for token2wav.

It mirrors what ``Qwen2_5OmniForConditionalGeneration.generate`` feeds the talker,
but by streaming: the prefill needs the prompt and the first reply token, so the
talker starts after the thinker's second step, not after its last. Decode step j
adds the codec embedding of the last code to reply entry j, where the entries are
the thinker's reply tokens 1, 2, ..., then the text-eos embedding in place of the
thinker's last (never fed back) token, then the text-pad embedding for ever.
A stream waits (``more=False``) while its next entry has not arrived.

``prefill_codec_embeds``: the talker's forward adds the codec pad and bos
embeddings to the last two prefill rows only when it is given an attention
mask, and transformers 5.23's ``generate`` gives it none, so the reference
decodes without them. The default (False) matches that reference; True is what
the forward does when called with a mask.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field

import torch
from transformers import DynamicCache, Qwen2_5OmniTalkerForConditionalGeneration

from omnitrio import Event, Request, StepLimits, StreamOutput, StreamWork
from stages.kit import (
    AutoregressiveStage,
    Outbox,
    Piece,
    Sampler,
    SamplingParams,
    SlotKV,
    on,
    step_output,
)

from .loading import load_stage_model, stage_folder
from .payloads import CodecCodes, ReplyEnd, ReplyStart, ReplyToken
from .stats import DecodeBatches


@dataclass
class _Stream:
    params: SamplingParams
    start: ReplyStart | None = None
    replies: list[torch.Tensor] = field(default_factory=list)  # [D] per thinker token
    num_text_tokens: int | None = None  # set by ReplyEnd
    sampler: Sampler | None = None
    kv: SlotKV | None = None  # this stream's slot in the stage's KV cache
    last_code: int | None = None
    num_decoded: int = 0  # decode forwards so far
    num_codes: int = 0
    finished: bool = False

    def entry(self, index: int) -> torch.Tensor | None:
        """Reply entry ``index`` (thinker token index + 1), or None while it has not arrived."""
        if index + 1 < len(self.replies):
            return self.replies[index + 1]
        if self.num_text_tokens is None or self.start is None:
            return None
        if index + 1 == self.num_text_tokens - 1:
            return self.start.text_eos
        return self.start.text_pad

    def can_prefill(self) -> bool:
        return self.kv is None and self.start is not None and len(self.replies) > 0

    def can_decode(self) -> bool:
        return (
            self.kv is not None and not self.finished and self.entry(self.num_decoded) is not None
        )


CODES_EVENT = "talker.codes"


class Qwen2_5OmniTalker(AutoregressiveStage):
    """The Qwen2.5-Omni talker as an omnitrio stage (see the module docstring).

    ``emit_codes``: also send each codec code to the client as an
    ``Event("talker.codes", {"codes": [...]})`` (for parity checks and tracing).
    """

    checkpoint = "qwen2.5-omni"  # model_path: one folder shared with the family's other stages
    max_inputs_per_step: int | None = None
    max_payloads_per_step = 4
    max_visible_per_step: int

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits:
        """What one step emits with these params (the config is checked by it)."""
        emit_codes = params.get("emit_codes", False)  # a subclass may pass it on in **kwargs
        if not isinstance(emit_codes, bool):
            raise TypeError(f"emit_codes must be true or false, got {emit_codes!r}")
        return StepLimits(cls.max_payloads_per_step, 1 if emit_codes else 0)

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str,
        max_tokens: int = 4096,
        temperature: float = 0.9,
        top_p: float = 0.8,
        top_k: int = 40,
        repetition_penalty: float = 1.05,
        seed: int = 0,
        prefill_codec_embeds: bool = False,
        emit_codes: bool = False,
        num_threads: int | None = None,
        packaging_queue: int = 8,
    ) -> None:
        super().__init__(name, device, num_threads=num_threads, packaging_queue=packaging_queue)
        folder = stage_folder(model_path, "talker")
        model = load_stage_model(Qwen2_5OmniTalkerForConditionalGeneration, folder, name)
        self.model = model.to(self.device)
        self.defaults = SamplingParams(
            temperature, top_p, top_k, repetition_penalty, max_tokens, seed
        )
        self.defaults.check()
        self.prefill_codec_embeds = prefill_codec_embeds
        self.emit_codes = emit_codes
        limits = self.step_limits({"emit_codes": emit_codes})
        self.max_visible_per_step = limits.max_visible_per_step
        model = self.model
        # generate() stops the talker at the codec pad or end code (its default eos list).
        self.stop_codes = frozenset([model.codec_pad_token, model.codec_eos_token])
        with torch.no_grad():
            codec = model.get_input_embeddings()
            self._codec_bos = codec(torch.tensor(model.codec_bos_token, device=self.device))  # [D]
            self._codec_pad = codec(torch.tensor(model.codec_pad_token, device=self.device))  # [D]
        self.streams: dict[str, _Stream] = {}
        self.batches = DecodeBatches()

    # ----- the stage protocol ---------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        params = SamplingParams.from_options(self.defaults, request.options, self.name)
        self.streams[stream_id] = _Stream(params)
        self.outboxes[stream_id] = Outbox()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        ids = [w.stream_id for w in batch]
        for work in batch:
            self._take(self.streams[work.stream_id], work.inputs, self.device)
        for sid in ids:
            stream = self.streams[sid]
            if stream.can_prefill():
                self._prefill(sid)
            elif stream.kv is None and stream.num_text_tokens is not None:
                stream.finished = True  # the thinker's reply was one token: nothing to say
        decoding = [sid for sid in ids if self.streams[sid].can_decode()]
        if decoding:
            self._decode(decoding)
        self.batches.record(len(decoding))
        self.clock.end_compute()
        return {sid: self._output(sid) for sid in ids}

    def stage_statistics(self) -> Mapping[str, float]:
        return {**super().stage_statistics(), **self.batches.snapshot()}

    # ----- the critical path ------------------------------------------------------------

    @staticmethod
    def _take(stream: _Stream, inputs: Sequence[object], device: torch.device) -> None:
        """The thinker's tensors, read where they are when it shares the device."""
        for item in inputs:
            if isinstance(item, ReplyStart):
                stream.start = ReplyStart(*(on(t, device) for t in astuple(item)))
            elif isinstance(item, ReplyToken):
                stream.replies.append(on(item.reply, device))
            elif isinstance(item, ReplyEnd):
                stream.num_text_tokens = item.num_tokens
            else:
                raise TypeError(f"talker got a {type(item).__name__} from the thinker")

    def _prefill(self, sid: str) -> None:
        stream = self.streams[sid]
        assert stream.start is not None
        prompt = stream.start.prompt  # [L, D]
        embeds = torch.cat(
            [prompt, stream.start.text_bos[None], stream.replies[0][None]]
        ).unsqueeze(0)  # [1, L + 2, D]
        if self.prefill_codec_embeds:
            embeds[:, -1, :] += self._codec_bos
            embeds[:, -2, :] += self._codec_pad
        length = embeds.shape[1]
        model = self.model
        history = [model.codec_mask_token] * prompt.shape[0]
        history += [model.codec_pad_token, model.codec_bos_token]
        stream.sampler = Sampler(stream.params, history, suppress=[model.codec_bos_token])
        cache = DynamicCache(config=model.config)
        positions = torch.arange(length, device=self.device)
        positions = positions.view(1, 1, length).expand(3, 1, length)  # [3, 1, L+2]
        out = model(
            inputs_embeds=embeds,
            attention_mask=torch.ones(1, length, dtype=torch.long, device=self.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        stream.kv = self.kv_slots.adopt(cache)
        self._sample({sid: out.logits[0, -1]})

    def _decode(self, sids: list[str]) -> None:
        streams = [self.streams[sid] for sid in sids]
        kvs = [s.kv for s in streams if s.kv is not None]
        codes = torch.tensor([[s.last_code] for s in streams], device=self.device)  # [B, 1]
        entries = torch.stack([s.entry(s.num_decoded) for s in streams])  # type: ignore[misc]
        embeds = self.model.get_input_embeddings()(codes) + entries[:, None, :]  # [B, 1, D]
        positions = torch.tensor([kv.length for kv in kvs], device=self.device)  # [B]
        positions = positions.view(1, -1, 1).expand(3, -1, 1)  # [3, B, 1]
        out, rows = self.kv_slots.decode(self.model, kvs, positions, inputs_embeds=embeds)
        for stream in streams:
            stream.num_decoded += 1
        self._sample({sid: out.logits[row, -1] for row, sid in zip(rows, sids, strict=True)})

    def _sample(self, logits: dict[str, torch.Tensor]) -> None:
        """Pick each stream's next code and store it: all the next step needs."""
        sampling_started = time.perf_counter()
        sent: dict[str, int] = {}
        for sid, row in logits.items():
            stream = self.streams[sid]
            assert stream.sampler is not None
            code = stream.sampler.pick(row.float())
            stream.num_codes += 1
            stream.last_code = code
            stream.finished = (
                code in self.stop_codes or stream.num_codes >= stream.params.max_tokens
            )
            if stream.finished and stream.kv is not None:
                stream.kv.release()  # no more decoding: the slot goes to the next stream
            if code not in self.stop_codes:
                sent[sid] = code
        self.clock.add_sampling(time.perf_counter() - sampling_started, len(logits))
        if sent:
            emit = self.emit_codes
            self.packager.submit(tuple(sent), lambda: _codes_pieces(sent, emit=emit))

    def _output(self, sid: str) -> StreamOutput:
        stream = self.streams[sid]
        return step_output(
            self.packager,
            sid,
            self.outboxes[sid],
            computing=not stream.finished,
            can_continue=stream.can_prefill() or stream.can_decode(),
            max_payloads=self.max_payloads_per_step,
        )


def _codes_pieces(codes: dict[str, int], *, emit: bool) -> dict[str, Piece]:
    """Packaging thread: one ``CodecCodes`` payload per stream (and its trace event)."""
    return {
        sid: Piece(
            payloads=(CodecCodes((code,)),),
            visible=(Event(CODES_EVENT, {"codes": (code,)}),) if emit else (),
        )
        for sid, code in codes.items()
    }
