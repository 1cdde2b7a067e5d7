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

from omnitrio import Event, Request, StreamOutput, StreamWork
from stages._packaging import Outbox, Packager, Piece, step_output
from stages._torch_device import on, stage_device
from stages._torch_kv import batched_decode, cache_length, cache_nbytes
from stages._torch_sampling import Sampler, SamplingParams

from ._loading import load_stage_model, stage_folder
from ._payloads import CodecCodes, ReplyEnd, ReplyStart, ReplyToken
from ._registry import register
from ._stats import ARStageStatistics, StepClock


@dataclass
class _Stream:
    params: SamplingParams
    start: ReplyStart | None = None
    replies: list[torch.Tensor] = field(default_factory=list)  # [D] per thinker token
    num_text_tokens: int | None = None  # set by ReplyEnd
    sampler: Sampler | None = None
    cache: DynamicCache | None = None
    last_code: int | None = None
    num_decoded: int = 0  # decode forwards so far
    num_codes: int = 0
    finished: bool = False
    outbox: Outbox = field(default_factory=Outbox)

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
        return self.cache is None and self.start is not None and len(self.replies) > 0

    def can_decode(self) -> bool:
        return (
            self.cache is not None
            and not self.finished
            and self.entry(self.num_decoded) is not None
        )


CODES_EVENT = "talker.codes"


class TalkerStage:
    """The Qwen2.5-Omni talker as an omnitrio stage (see the module docstring).

    ``emit_codes``: also send each codec code to the client as an
    ``Event("talker.codes", {"codes": [...]})`` (for parity checks and tracing).
    """

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 4
    max_visible_per_step: int

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
        torch_threads: int | None = None,
        packaging_queue_jobs: int = 8,
    ) -> None:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self.device = stage_device(name, device)
        self.name = name
        folder = stage_folder(model_path, "talker")
        model = load_stage_model(Qwen2_5OmniTalkerForConditionalGeneration, folder, name)
        self.model = model.to(self.device)
        self.defaults = SamplingParams(
            temperature, top_p, top_k, repetition_penalty, max_tokens, seed
        )
        self.defaults.check()
        self.prefill_codec_embeds = prefill_codec_embeds
        self.emit_codes = emit_codes
        self.max_visible_per_step = 1 if emit_codes else 0
        model = self.model
        # generate() stops the talker at the codec pad or end code (its default eos list).
        self.stop_codes = frozenset([model.codec_pad_token, model.codec_eos_token])
        with torch.no_grad():
            codec = model.get_input_embeddings()
            self._codec_bos = codec(torch.tensor(model.codec_bos_token, device=self.device))  # [D]
            self._codec_pad = codec(torch.tensor(model.codec_pad_token, device=self.device))  # [D]
        self._streams: dict[str, _Stream] = {}
        self._clock = StepClock()
        self._packager = Packager(f"omnitrio-{name}", max_queued_jobs=packaging_queue_jobs)
        register(self)

    # ----- the stage protocol ---------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        params = SamplingParams.from_options(self.defaults, request.options, self.name)
        self._streams[stream_id] = _Stream(params)

    def close_stream(self, stream_id: str) -> None:
        del self._streams[stream_id]
        self._packager.drop(stream_id)

    def close(self) -> None:
        self._streams.clear()
        self._packager.close()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        started = self._clock.step_started()
        ids = [w.stream_id for w in batch]
        for work in batch:
            self._take(self._streams[work.stream_id], work.inputs, self.device)
        for sid in ids:
            stream = self._streams[sid]
            if stream.can_prefill():
                self._prefill(sid)
            elif stream.cache is None and stream.num_text_tokens is not None:
                stream.finished = True  # the thinker's reply was one token: nothing to say
        decoding = [sid for sid in ids if self._streams[sid].can_decode()]
        if decoding:
            self._decode(decoding)
        self._clock.last_batch_size = len(decoding)
        self._clock.max_batch_size = max(self._clock.max_batch_size, len(decoding))
        outputs = {sid: self._output(sid) for sid in ids}
        self._clock.step_s += time.perf_counter() - started
        return outputs

    def statistics(self) -> ARStageStatistics:
        kv_bytes = sum(cache_nbytes(s.cache) for s in self._streams.values() if s.cache)
        return self._clock.snapshot(
            num_active=len(self._streams), kv_bytes=kv_bytes, packaging=self._packager.times_s()
        )

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
        stream = self._streams[sid]
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
        stream.cache = DynamicCache(config=model.config)
        positions = torch.arange(length, device=self.device)
        positions = positions.view(1, 1, length).expand(3, 1, length)  # [3, 1, L+2]
        forward_started = time.perf_counter()
        out = model(
            inputs_embeds=embeds,
            attention_mask=torch.ones(1, length, dtype=torch.long, device=self.device),
            position_ids=positions,
            past_key_values=stream.cache,
            use_cache=True,
        )
        self._sample({sid: out.logits[0, -1]}, forward_started)

    def _decode(self, sids: list[str]) -> None:
        streams = [self._streams[sid] for sid in sids]
        caches = [s.cache for s in streams if s.cache is not None]
        codes = torch.tensor([[s.last_code] for s in streams], device=self.device)  # [B, 1]
        entries = torch.stack([s.entry(s.num_decoded) for s in streams])  # type: ignore[misc]
        embeds = self.model.get_input_embeddings()(codes) + entries[:, None, :]  # [B, 1, D]
        positions = torch.tensor([cache_length(c) for c in caches], device=self.device)  # [B]
        positions = positions.view(1, -1, 1).expand(3, -1, 1)  # [3, B, 1]
        forward_started = time.perf_counter()
        out = batched_decode(self.model, caches, positions, inputs_embeds=embeds)
        for stream in streams:
            stream.num_decoded += 1
        self._sample({sid: out.logits[row, -1] for row, sid in enumerate(sids)}, forward_started)

    def _sample(self, logits: dict[str, torch.Tensor], forward_started: float) -> None:
        """Pick each stream's next code and store it: all the next step needs."""
        sampling_started = time.perf_counter()
        self._clock.forward_s += sampling_started - forward_started
        self._clock.num_forwards += 1
        sent: dict[str, int] = {}
        for sid, row in logits.items():
            stream = self._streams[sid]
            assert stream.sampler is not None
            code = stream.sampler.pick(row.float())
            stream.num_codes += 1
            stream.last_code = code
            stream.finished = (
                code in self.stop_codes or stream.num_codes >= stream.params.max_tokens
            )
            if code not in self.stop_codes:
                sent[sid] = code
        self._clock.sampling_s += time.perf_counter() - sampling_started
        self._clock.num_samplings += 1
        self._clock.num_tokens += len(logits)
        if sent:
            emit = self.emit_codes
            self._packager.submit(tuple(sent), lambda: _codes_pieces(sent, emit=emit))

    def _output(self, sid: str) -> StreamOutput:
        stream = self._streams[sid]
        return step_output(
            self._packager,
            sid,
            stream.outbox,
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
