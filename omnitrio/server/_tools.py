"""Function calling on the HTTP API: the chat request's ``tools`` and ``tool_choice`` as
omnitrio's tools (checked and encoded by omnitrio/tools.py, as Realtime's are), and the
LLM stage's tool-call events as chat-completion ``tool_calls``.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
import pydantic_core

from .._items import Event
from ..tools import (
    FINISH_EVENT,
    TOOL_EVENTS,
    FunctionTool,
    ToolChoice,
    ToolError,
    ToolLimits,
    arguments_json,
    check_tool_choice,
    check_tools,
    empty_parameters,
)


class _Lenient(pydantic.BaseModel):
    # Unknown keys are refused, as everywhere in the API (see _requests.py).
    model_config = pydantic.ConfigDict(extra="forbid")


class FunctionSpec(_Lenient):
    name: str  # the rules (pattern, no two alike) are check_tools's
    description: str = ""
    parameters: dict[str, Any] = pydantic.Field(default_factory=empty_parameters)
    strict: bool | None = None  # the tool-call grammar always holds calls to the schema


class ChatTool(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class _Named(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: _Named


ChatToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class ToolCallFunction(_Lenient):
    name: str
    arguments: str

    @pydantic.field_validator("arguments")
    @classmethod
    def _json_object(cls, arguments: str) -> str:
        """A JSON object nested at most ``MAX_ARGUMENTS_DEPTH`` deep (``"[" * 200000``
        is a 400 naming ``messages.<i>.tool_calls.<j>.function.arguments``)."""
        try:
            arguments_json(arguments)
        except ValueError as exc:
            raise pydantic_core.PydanticCustomError(
                "arguments", "{problem}", {"problem": str(exc)}
            ) from None
        return arguments


class ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatToolError(ValueError):
    """Tools or a tool choice that break the rules; ``param`` is the request field,
    ``problem`` what is wrong with it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.problem = message


def chat_tools(
    tools: list[ChatTool] | None, choice: ChatToolChoice | None, limits: ToolLimits | None = None
) -> tuple[list[FunctionTool], ToolChoice]:
    """A chat request's tools and tool choice, checked by omnitrio's rules.
    Raises ``ChatToolError`` naming the field (``tools.1.function.parameters``)."""
    functions = [
        FunctionTool(t.function.name, t.function.description, t.function.parameters)
        for t in tools or ()
    ]
    if isinstance(choice, NamedToolChoice):
        wanted = ToolChoice("required", choice.function.name)
    else:
        wanted = ToolChoice(choice or "auto")
    try:
        check_tools(functions, limits)
        check_tool_choice(functions, wanted)
    except ToolError as exc:
        param = exc.field if exc.index is None else f"tools.{exc.index}.function.{exc.field}"
        raise ChatToolError(str(exc), param) from None
    return functions, wanted


def is_tool_event(item: object) -> bool:
    return isinstance(item, Event) and (item.name in TOOL_EVENTS or item.name == FINISH_EVENT)
