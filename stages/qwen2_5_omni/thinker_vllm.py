"""The Qwen2.5-Omni thinker on vLLM (``engine: vllm`` in the thinker's params).

The same stage as ``Qwen2_5OmniThinker`` — the same prompts, text deltas and talker
payloads (``ReplyStart``, ``ReplyToken``, ``ReplyEnd``), packaged off the critical
path — with the critical path on vLLM's ``LLMEngine`` (``stages.kit.VllmEngine``, the
engine in a process of its own):

- ``open_stream``: the prompt's ids go to the engine (``add``) at once; a request
  vLLM refuses fails that stream alone.
- a step: one engine step when a stream of the batch is waiting for a token; then
  each stream of the batch takes one token (the one a torch thinker's step samples).
- ``close_stream`` (closed, cancelled, failed): the engine's request is aborted.

Backpressure is the Qwen3-Omni vLLM thinker's (docs/design.md): what the engine makes
ahead for a stream held back waits as token ids and hidden-state rows in the stream's
own buffer, at most its ``max_tokens``.

The talker reads, for the prompt and then for every answer token fed back, the
thinker's last hidden state (after the final norm) plus the token's embedding, audio
positions' embeddings zeroed (as ``generate`` does). The engine returns the last
hidden state of every token it runs through forward hooks on vLLM's decoder
(``stages/_vllm_worker.py``, checked against vLLM 0.32.0's internals): the prompt's
rows with the first token, then answer token k's row with token k + 1. Token
embeddings come from the checkpoint's embedding matrix, loaded alone.

Sampling is vLLM's (``temperature``, ``top_p``, ``top_k``, ``seed``,
``repetition_penalty`` over the prompt's and the answer's tokens, as ``generate``'s).

Audio input (``audio_input``, on by default) goes through vLLM's multimodal path: the
prompt's run of audio placeholders is given as one, with the 16 kHz waveform, and
vLLM's processor (the checkpoint's ``Qwen2_5OmniProcessor``) makes the features and
expands the placeholder again; the engine then runs its own audio encoder. Off, an
audio request fails with an ``OptionError`` naming ``engine: torch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import GenerationConfig, Qwen2_5OmniThinkerConfig

from omnitrio import Request, StreamOutput, StreamWork
from stages.kit import (
    AutoregressiveStage,
    Detokenizer,
    OptionError,
    Outbox,
    Piece,
    Sampler,
    SamplingParams,
    VllmEngine,
    VllmEngineStage,
    check_prompt_rows,
    constructor_signature,
    load_embedding,
    one_placeholder,
)

from .loading import speaker_of, stage_folder
from .payloads import ReplyEnd, ReplyStart, ReplyToken
from .prompt import build_prompt
from .stats import DecodeBatches
from .thinker import Qwen2_5OmniThinker, _eos_ids, _News, _Stream


@dataclass
class _EngineStream(_Stream):
    pending: list[int] = field(default_factory=list)  # made by the engine, not yet taken
    states: list[torch.Tensor] = field(default_factory=list)  # last-layer rows [n, D], in order
    engine_done: bool = False  # the engine has finished the request


class Qwen2_5OmniThinkerVllm(VllmEngineStage, Qwen2_5OmniThinker):
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
        folder = stage_folder(model_path, "thinker")
        config = Qwen2_5OmniThinkerConfig.from_pretrained(folder)
        self.embeddings = load_embedding(folder, "model.embed_tokens.weight", self.device)
        self._read_checkpoint(
            model_path,
            self.embeddings,
            _eos_ids(GenerationConfig.from_pretrained(folder)),
            SamplingParams(temperature, top_p, top_k, repetition_penalty, max_tokens, seed),
            speaker,
            system_prompt,
            emit_ids,
        )
        self.audio_token_id = config.audio_token_index
        self.batches = DecodeBatches()
        self.streams: dict[str, _EngineStream] = {}  # type: ignore[assignment]
        self.engine = VllmEngine.start(
            model_path,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            kv_cache_bytes=kv_cache_bytes,
            dtype=dtype,  # bfloat16 on a GPU
            # transformers' last hidden state (after the final norm): what the talker reads
            hidden_layers=[config.get_text_config().num_hidden_layers],
            audio=audio_input,
        )
        self.audio_input = audio_input

    # ----- the stage protocol ---------------------------------------------------------

    def open_stream(self, stream_id: str, request: Request) -> None:
        if request.audio is not None and not self.audio_input:
            raise OptionError(
                f"stage {self.name!r}: audio input is off here (audio_input: false); "
                "use engine: torch or audio_input: true for audio requests"
            )
        prompt = build_prompt(request, self.tokenizer, self.features, self.system_prompt)
        params = SamplingParams.from_options(self.defaults, request.options, self.name)
        speaker = speaker_of(
            request.options.knobs.get("speaker"), self.speakers, self.default_speaker
        )
        ids = prompt.input_ids[0].tolist()
        audio = None
        if request.audio is not None:
            wave = np.frombuffer(request.audio.pcm16, dtype="<i2").astype(np.float32) / 32768.0
            audio = (wave, request.audio.sample_rate_hz)
        self.add_request(
            stream_id,
            one_placeholder(ids, self.audio_token_id) if audio is not None else ids,
            params,
            sorted(self.eos_token_ids),
            token_states=True,
            audio=audio,
        )
        self.streams[stream_id] = _EngineStream(
            prompt, Sampler(params, ids), speaker, Detokenizer(self.tokenizer)
        )
        self.outboxes[stream_id] = Outbox()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        streams = self.engine_round(batch)
        for sid, stream in streams.items():
            if stream.finished:
                continue
            if stream.engine_done and not stream.pending:
                stream.finished = True  # ended by the engine with no token left to give
                self._end(sid, ReplyEnd(stream.num_generated))
            elif stream.pending:
                self._take(sid, stream)
        self.clock.end_compute()
        return {sid: self._output(sid) for sid in streams}

    def _engine_step(self) -> None:
        outputs = self.engine.step()
        self.batches.record(len(outputs))  # requests the engine stepped together
        for out in outputs:
            stream = self.streams.get(out.request_id)
            if stream is None:
                continue  # closed meanwhile
            stream.pending.extend(out.new_token_ids)
            stream.engine_done = out.finished
            if out.states is not None:
                stream.states.append(torch.from_numpy(out.states[0].copy()).to(self.device))

    def _take(self, sid: str, stream: _EngineStream) -> None:
        """The stream's next token and the hidden-state rows its payload needs: the
        prompt's with the first token, the previous answer token's with each later one."""
        token = stream.pending.pop(0)
        stream.num_generated += 1
        stream.finished = (
            token in self.eos_token_ids
            or stream.num_generated >= stream.sampler.params.max_tokens
            or (stream.engine_done and not stream.pending)
        )
        news = _News(token, stream.finished, stream.num_generated)
        if stream.num_generated == 1:
            length = len(stream.prompt.input_ids[0])
            check_prompt_rows(self.name, stream.states[0].shape[0] if stream.states else 0, length)
            rows = _pop_rows(stream.states, length)
            start = self._reply_start_from
            self.packager.submit((sid,), lambda: {sid: start(sid, rows, news)})
        else:
            row, fed = _pop_rows(stream.states, 1)[0], stream.next_token
            assert fed is not None  # the token taken before this one, fed to make it
            reply = self._reply_token_from
            self.packager.submit((sid,), lambda: {sid: reply(sid, fed, row, news)})
        stream.next_token = token

    def _end(self, sid: str, end: ReplyEnd) -> None:
        self.packager.submit((sid,), lambda: {sid: Piece((end,))})

    # ----- packaging (on the packaging thread) -----------------------------------------

    def _reply_start_from(self, sid: str, last: torch.Tensor, news: _News) -> Piece:
        stream = self.streams.get(sid)
        if stream is None:
            return Piece()
        input_ids = stream.prompt.input_ids[0].to(self.device)  # [L]
        prompt_embeds = self.embeddings[input_ids].clone()  # [L, D]
        prompt_embeds[input_ids == self.audio_token_id] = 0.0  # as generate() does
        start = ReplyStart(
            prompt=last + prompt_embeds,
            text_bos=self._text_bos[stream.speaker],
            text_eos=self._text_eos,
            text_pad=self._text_pad,
        )
        return self._with_news(stream, (start,), news)

    def _reply_token_from(self, sid: str, fed: int, last: torch.Tensor, news: _News) -> Piece:
        stream = self.streams.get(sid)
        if stream is None:
            return Piece()
        return self._with_news(stream, (ReplyToken(last + self.embeddings[fed]),), news)

    def stage_statistics(self) -> Mapping[str, float]:
        return {**self.engine_statistics(), **self.batches.snapshot()}


def _pop_rows(blocks: list[torch.Tensor], count: int) -> torch.Tensor:
    """The first ``count`` rows of the blocks [n, D] (taken out of them): [count, D]."""
    taken: list[torch.Tensor] = []
    need = count
    while need:
        if not blocks:
            raise RuntimeError(f"the vLLM engine gave {count - need} of {count} hidden-state rows")
        block = blocks[0]
        taken.append(block[:need])
        if block.shape[0] <= need:
            blocks.pop(0)
        else:
            blocks[0] = block[need:]
        need -= taken[-1].shape[0]
    return torch.cat(taken)


Qwen2_5OmniThinkerVllm.__signature__ = constructor_signature(Qwen2_5OmniThinkerVllm)
