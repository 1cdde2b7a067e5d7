"""One answer's items, assembled: the pure fold both API dialects format.

A pipeline stream's visible items are text deltas, audio chunks and events; the
LLM stage's events (``tool_call``, ``tool_call.arguments``, ``tool_call.done``,
``llm.finish``; see omnitrio/tools.py) describe function calls and how the answer
ended. ``AnswerAssembler.take`` turns each item into typed answer events (text,
audio, a call's start, arguments and end, the finish) and keeps the calls so far,
so that chat completions (HTTP) and a Realtime response format the same folding.
It does no I/O and holds no clock: tests drive it with items alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._items import AudioChunk, Event, TextDelta, VisibleItem
from .tools import FINISH_EVENT, TOOL_ARGUMENTS_EVENT, TOOL_CALL_EVENT, TOOL_DONE_EVENT


@dataclass(frozen=True)
class CallStarted:
    """The model began call ``index`` (0 for the answer's first) to function ``name``."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next piece of call ``index``'s arguments (JSON text)."""

    index: int
    call_id: str
    delta: str


@dataclass(frozen=True)
class CallDone:
    """Call ``index`` is whole: ``arguments`` is its JSON object as text."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Finished:
    """How the LLM stage ended the answer (None: it did not say)."""

    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True)
class ToolCall:
    """One call as the answer holds it so far."""

    call_id: str
    name: str
    arguments: str


AnswerEvent = TextDelta | AudioChunk | CallStarted | CallArguments | CallDone | Finished | Event
"""What one item becomes: text and audio as they came, a call's parts, the finish, or
an event the LLM stage did not send (a transcript, a trace), passed on as it came."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class AnswerAssembler:
    """The fold of one answer's items (see the module docstring)."""

    def __init__(self) -> None:
        self._calls: dict[str, ToolCall] = {}  # by call id, in the order they began
        self.finished: Finished | None = None
        self.num_text_deltas = 0

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls.values())

    def take(self, item: VisibleItem) -> list[AnswerEvent]:
        """The answer events for one pipeline item (none for a call event that names no
        call begun, or an arguments piece of a call not begun)."""
        if isinstance(item, TextDelta):
            self.num_text_deltas += 1
            return [item]
        if not isinstance(item, Event):
            return [item]
        if item.name == FINISH_EVENT:
            reason = item.data.get("finish_reason")
            self.finished = Finished(
                reason if isinstance(reason, str) else None,
                _int(item.data.get("prompt_tokens")),
                _int(item.data.get("completion_tokens")),
            )
            return [self.finished]
        if item.name not in (TOOL_CALL_EVENT, TOOL_ARGUMENTS_EVENT, TOOL_DONE_EVENT):
            return [item]
        call_id = item.data.get("call_id")
        if not isinstance(call_id, str):
            return []
        if item.name == TOOL_CALL_EVENT:
            if call_id in self._calls:
                return []
            name = str(item.data.get("name"))
            self._calls[call_id] = ToolCall(call_id, name, "")
            return [CallStarted(len(self._calls) - 1, call_id, name)]
        call = self._calls.get(call_id)
        if call is None:
            return []
        index = list(self._calls).index(call_id)
        if item.name == TOOL_ARGUMENTS_EVENT:
            delta = str(item.data.get("delta", ""))
            self._calls[call_id] = ToolCall(call_id, call.name, call.arguments + delta)
            return [CallArguments(index, call_id, delta)]
        arguments = str(item.data.get("arguments", call.arguments))
        self._calls[call_id] = ToolCall(call_id, call.name, arguments)
        return [CallDone(index, call_id, call.name, arguments)]
