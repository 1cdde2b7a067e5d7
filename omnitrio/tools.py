"""Function calling in one place: the tool-call text, the tools as request options,
and the rules a list of tools must meet, for both API dialects and the LLM stage.

The pipeline speaks of tools through ``Request.options`` (``ResponseOptions``): its
``tools`` (``FunctionTool`` values) and ``tool_choice`` (``ToolChoice``: ``auto``,
``none``, ``required``, or the function a named choice forces). The LLM stage
answers with events (``tool_call``, ``tool_call.arguments``, ``tool_call.done``,
``llm.finish``; see stages/voice/llm.py). A call is generated, and a conversation
records it, as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``; its
arguments follow the tool's JSON schema under a grammar (``tool_call_lark``) that
the server compiles once per request (``check_tools``) before a stream is opened,
so a schema the grammar engine (llguidance) cannot compile is the client's error,
naming the tool, not a failed stream.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import llguidance

from ._options import (
    TOOL_MODES,
    FunctionTool,
    ResponseOptions,
    ToolChoice,
    ToolMode,
    empty_parameters,
)
from ._schema_bounds import depth_of, loads_bounded, ref_cycle

__all__ = [
    "FINISH_EVENT",
    "TOOL_ARGUMENTS_EVENT",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_EVENT",
    "TOOL_CALL_OPEN",
    "TOOL_DONE_EVENT",
    "TOOL_EVENTS",
    "TOOL_MODES",
    "FunctionTool",
    "ToolChoice",
    "ToolError",
    "ToolLimits",
    "ToolMode",
    "arguments_json",
    "call_text",
    "check_tool_choice",
    "check_tools",
    "empty_parameters",
    "tool_call_lark",
    "with_tools",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_CALL_EVENT = "tool_call"  # call_id, name: a call begins
TOOL_ARGUMENTS_EVENT = "tool_call.arguments"  # call_id, delta: the arguments' next piece
TOOL_DONE_EVENT = "tool_call.done"  # call_id, name, arguments: the whole call
TOOL_EVENTS = (TOOL_CALL_EVENT, TOOL_ARGUMENTS_EVENT, TOOL_DONE_EVENT)
"""The LLM stage's events for one call; ``llm.finish`` ends every answer."""
FINISH_EVENT = "llm.finish"

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A function's name: OpenAI's rule (letters, digits, ``_`` and ``-``, 64 at most)."""

# Compact JSON (one space after ':' and ','): a small model spends no tokens on layout,
# and free whitespace lured SmolLM2 into empty values.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolLimits:
    """What one request's tools may cost (``ServerSettings`` sets them per server).

    Each tool's schema is compiled to check it, ~1 ms a tool: 19,000 tiny tools took
    16.8 s. ``max_tools`` is OpenAI's own limit; ``max_tools_bytes`` bounds the tools
    as JSON (names, descriptions, schemas), ``max_schema_depth`` a schema's nesting."""

    max_tools: int = 128
    max_tools_bytes: int = 256 * 1024
    max_schema_depth: int = 32

    def __post_init__(self) -> None:
        for name in ("max_tools", "max_tools_bytes", "max_schema_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int of at least 1, not {value!r}")


MAX_ARGUMENTS_DEPTH = 64
"""A call's arguments (a JSON object as text) nest at most this deep."""


class ToolError(ValueError):
    """Tools or a tool choice that break the rules. ``index`` and ``field`` say where:
    ``tools[index].field``, ``tools`` (``index`` None) or ``tool_choice``; each API
    dialect names the param in its own spelling."""

    def __init__(self, message: str, *, index: int | None = None, field: str = "tools") -> None:
        super().__init__(message)
        self.index = index
        self.field = field


def check_tools(tools: Sequence[FunctionTool], limits: ToolLimits | None = None) -> None:
    """The one set of rules for tools, checked before a stream is opened: at most
    ``limits.max_tools`` of at most ``limits.max_tools_bytes`` as JSON, each name matches
    ``NAME_PATTERN``, no two tools share a name, and each ``parameters`` is a JSON schema
    no deeper than ``limits.max_schema_depth``, without ``$ref`` cycles, that the
    tool-call grammar compiles. Raises ``ToolError``.

    Compiling costs about a millisecond a tool: a server runs this off its event loop.
    Results are kept per tool (``grammar_problem``), so a client that sends the same
    tools with every request pays once."""
    limits = limits or ToolLimits()
    if len(tools) > limits.max_tools:
        raise ToolError(f"{len(tools)} tools are more than the limit of {limits.max_tools}")
    seen: set[str] = set()
    num_bytes = 0
    for index, tool in enumerate(tools):
        if not NAME_PATTERN.fullmatch(tool.name):
            raise ToolError(
                f"function name {tool.name!r:.80} must be 1 to 64 letters, digits, '_' or '-'",
                index=index,
                field="name",
            )
        if tool.name in seen:
            raise ToolError(f"two functions are named {tool.name!r}", index=index, field="name")
        seen.add(tool.name)
        if not isinstance(tool.parameters, Mapping):
            raise ToolError(
                "parameters must be a JSON schema object", index=index, field="parameters"
            )
        depth = depth_of(tool.parameters, limits.max_schema_depth)
        if depth > limits.max_schema_depth:
            raise ToolError(
                f"parameters nest deeper than the limit of {limits.max_schema_depth} levels",
                index=index,
                field="parameters",
            )
        num_bytes += len(json.dumps(tool.described()))
        if num_bytes > limits.max_tools_bytes:
            raise ToolError(
                f"the tools are more than the limit of {limits.max_tools_bytes} bytes as JSON "
                f"(tools 0-{index} alone)"
            )
        cycle = ref_cycle(tool.parameters)
        if cycle is not None:
            raise ToolError(
                f"the parameters of function {tool.name!r} refer to themselves ({cycle}); "
                "a recursive schema cannot be compiled to a bounded tool-call grammar",
                index=index,
                field="parameters",
            )
        problem = grammar_problem(tool_call_lark([tool]))
        if problem:
            raise ToolError(
                f"the parameters of function {tool.name!r} cannot be compiled to a "
                f"tool-call grammar: {problem}",
                index=index,
                field="parameters",
            )


_VERDICTS: OrderedDict[str, str | None] = OrderedDict()
_VERDICTS_LOCK = threading.Lock()
MAX_VERDICTS = 1024
"""Grammars whose verdict is kept (each a tool's, bounded by ``max_tools_bytes``)."""


def grammar_problem(lark: str) -> str | None:
    """What llguidance finds wrong with a tool's grammar (its first line), or None;
    kept for the last ``MAX_VERDICTS`` grammars."""
    with _VERDICTS_LOCK:
        if lark in _VERDICTS:
            _VERDICTS.move_to_end(lark)
            return _VERDICTS[lark]
    problem = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_lark(lark), None
    )
    verdict = None
    if problem:
        first = problem.strip().splitlines()[0].removeprefix("at ").partition(": ")[2]
        verdict = (first or problem.strip())[:300]
    remember_verdicts({lark: verdict})
    return verdict


def remember_verdicts(verdicts: Mapping[str, str | None]) -> None:
    """Keep verdicts found elsewhere (a checking process) for ``grammar_problem``."""
    with _VERDICTS_LOCK:
        for lark, verdict in verdicts.items():
            _VERDICTS[lark] = verdict
            _VERDICTS.move_to_end(lark)
        while len(_VERDICTS) > MAX_VERDICTS:
            _VERDICTS.popitem(last=False)


def check_tool_choice(tools: Sequence[FunctionTool], choice: ToolChoice) -> None:
    """A choice that can be met: a named function is among ``tools``, and a required
    call has tools. Raises ``ToolError``."""
    if choice.name is not None and choice.name not in {t.name for t in tools}:
        raise ToolError(
            f"tool_choice names function {choice.name!r}, which is not among the tools",
            field="tool_choice",
        )
    if choice.mode == "required" and not tools:
        raise ToolError("tool_choice asks for a call, but there are no tools", field="tool_choice")


def with_tools(
    options: ResponseOptions, tools: Sequence[FunctionTool], choice: ToolChoice
) -> ResponseOptions:
    """``options`` with ``tools`` and ``choice`` (checked with ``check_tools`` and
    ``check_tool_choice``); without tools the choice is moot and left at ``auto``."""
    if not tools:
        return options
    return replace(options, tools=tuple(tools), tool_choice=choice)


def new_call_id() -> str:
    """A fresh function call id, ``call_3f2a...`` (96 random bits, as the Realtime API's
    ids: unique without coordination)."""
    return f"call_{secrets.token_hex(12)}"


def call_text(name: str, arguments: str) -> str:
    """A tool call as the model writes it; ``arguments``: a JSON object as text."""
    return (
        f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{TOOL_CALL_CLOSE}'
    )


def arguments_json(arguments: str) -> str:
    """A call's ``arguments`` (a JSON object as text), checked and made one line.
    Raises ``ValueError`` saying what is wrong."""
    try:
        value = loads_bounded(arguments, MAX_ARGUMENTS_DEPTH)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not JSON ({exc})") from None
    except ValueError as exc:  # too deep
        raise ValueError(f"arguments are {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object")
    return json.dumps(value)


def tool_call_lark(tools: Sequence[FunctionTool]) -> str:
    """The grammar of one call to any of ``tools``, in llguidance's Lark dialect:
    ``<tool_call>{"name": "<one of tools>", "arguments": <valid JSON>}</tool_call>``,
    each tool's arguments following its own schema (its name fixes which)."""
    rules = [f"start: {json.dumps(TOOL_CALL_OPEN)} call {json.dumps(TOOL_CALL_CLOSE)}"]
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    for index, tool in enumerate(tools):
        head = json.dumps(f'{{"name": {json.dumps(tool.name)}, "arguments": ')
        rules.append(f'call_{index}: {head} args_{index} "}}"')
        schema = {**tool.parameters, "x-guidance": COMPACT_JSON}
        rules.append(f"args_{index}: %json {json.dumps(schema)}")
    return "\n".join(rules)
