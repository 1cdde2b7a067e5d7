"""Function calling on the HTTP API: the request's tools as pipeline options, and the
LLM stage's tool-call events as chat-completion ``tool_calls``.

The pipeline speaks of tools through ``Request.options`` (``tools``: a JSON list of
``{"name", "description", "parameters"}``; ``tool_choice``: ``auto``, ``none`` or
``required``; ``tool_name``: the function a named choice forces) and answers with
events (``tool_call``, ``tool_call.arguments``, ``tool_call.done``, ``llm.finish``);
see stages/voice/llm.py. A conversation's calls and results travel as text lines:
``assistant: <tool_call>{"name": ..., "arguments": ...}</tool_call>`` and
``tool: <result>``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pydantic

from .._items import Event, Scalar

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


class _Lenient(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")


class FunctionSpec(_Lenient):
    name: str = pydantic.Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = ""
    parameters: dict[str, Any] = pydantic.Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


class ChatTool(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class _Named(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: _Named


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class ToolCallFunction(_Lenient):
    name: str
    arguments: str


class ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


def tool_options(
    functions: list[FunctionSpec], choice: ToolChoice | None, where: str
) -> dict[str, Scalar]:
    """The pipeline options for ``functions`` and ``choice``. Raises ``ValueError``
    naming the field for a choice that cannot be met."""
    if not functions:
        if choice == "required" or isinstance(choice, NamedToolChoice):
            raise ValueError(f"{where}: a tool call was asked for, but there are no tools")
        return {}
    described = [f.model_dump() for f in functions]
    options: dict[str, Scalar] = {"tools": json.dumps(described), "tool_choice": "auto"}
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in {f.name for f in functions}:
            raise ValueError(f"{where}: function {choice.function.name!r} is not among the tools")
        options.update(tool_choice="required", tool_name=choice.function.name)
    elif choice is not None:
        options["tool_choice"] = choice
    return options


def call_line(name: str, arguments: str) -> str:
    """A tool call as the conversation's text records it."""
    return (
        f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{TOOL_CALL_CLOSE}'
    )


def arguments_json(arguments: str, where: str) -> str:
    """A call's ``arguments`` (a JSON object as text), checked and made one line."""
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        raise ValueError(f"{where}: arguments are not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: arguments must be a JSON object")
    return json.dumps(value)


def is_tool_event(item: object) -> bool:
    return isinstance(item, Event) and item.name in (
        "tool_call",
        "tool_call.arguments",
        "tool_call.done",
        "llm.finish",
    )
