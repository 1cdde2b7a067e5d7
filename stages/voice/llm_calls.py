"""A voice LLM answer that is a tool call, as the client's events (llm.py).

The call is generated as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
under a grammar (``_grammar.py``); its text arrives token by token and goes to the
client as ``tool_call`` (``call_id``, ``name``) once the name is complete,
``tool_call.arguments`` (``call_id``, ``delta``) as the arguments grow, and
``tool_call.done`` (``call_id``, ``name``, ``arguments``) at the closing marker. None of
it goes to the TTS stage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from omnitrio import Event, VisibleItem
from omnitrio.tools import (
    TOOL_ARGUMENTS_EVENT,
    TOOL_CALL_CLOSE,
    TOOL_CALL_EVENT,
    TOOL_CALL_OPEN,
    TOOL_DONE_EVENT,
)

ARGUMENTS_KEY = ', "arguments": '
CALL_END = "}" + TOOL_CALL_CLOSE


@dataclass
class ToolCall:
    """A tool call being generated: its id, its text so far, what was sent of it."""

    id: str
    text: str = ""
    name: str | None = None
    arguments_sent: str = ""
    done: bool = False  # tool_call.done was sent

    def events(self, text: str) -> list[VisibleItem]:
        """The events for the call's new ``text``."""
        self.text += text
        events: list[VisibleItem] = []
        if self.done:
            return events  # the end-of-turn token after the call
        body = self.text.removeprefix(TOOL_CALL_OPEN)
        if self.name is None:
            head, sep, _ = body.partition(ARGUMENTS_KEY)
            if not sep:
                return events
            self.name = str(json.loads(head + "}")["name"])
            events.append(Event(TOOL_CALL_EVENT, {"call_id": self.id, "name": self.name}))
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
        delta = arguments[len(self.arguments_sent) :]
        if delta:
            self.arguments_sent = arguments
            events.append(Event(TOOL_ARGUMENTS_EVENT, {"call_id": self.id, "delta": delta}))
        if complete:
            self.done = True
            fields = {"call_id": self.id, "name": self.name, "arguments": arguments}
            events.append(Event(TOOL_DONE_EVENT, fields))
        return events
