"""Realtime frames that carry tools, checked off the event loop before the session
sees them.

The Realtime session (``omnitrio.realtime``) is sans-io and runs on the event loop;
checking a frame's tools compiles each one's schema (about a millisecond a tool),
which is too long to do there. A frame that may carry tools (``session.update``,
``response.create``) is first decoded and its tools' grammars compiled on a checking
thread (``ClientShares.off_loop``); the verdicts are kept (``omnitrio.tools``'
``grammar_problem``, and ``remember_verdicts`` for a caller elsewhere), so when the
session checks the same tools on the loop a moment later they cost a look-up.
Whatever is wrong with the frame, the session reports; this only does the slow
part early.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._schema_bounds import depth_of, ref_cycle
from ..realtime import SessionConfig
from ..realtime._encode import decode_frame
from ..realtime._errors import ClientEventError
from ..tools import FunctionTool, grammar_problem, tool_call_lark


def may_carry_tools(frame: str | bytes | None) -> bool:
    """Cheap: can this frame hold a ``tools`` field at all?"""
    if isinstance(frame, str):
        return '"tools"' in frame
    return frame is not None and b"tools" in frame


def tool_verdicts(frame: str | bytes, config: SessionConfig) -> dict[str, str | None]:
    """The grammar verdicts of the tools ``frame`` carries (a session's or a response's),
    for ``remember_verdicts`` (plain data in and out: it could run in another process)."""
    try:
        message = decode_frame(
            frame, config.framing, config.max_message_bytes, config.max_frame_values
        )
    except ClientEventError:
        return {}  # the session refuses it again, cheaply
    limits = config.tool_limits
    verdicts: dict[str, str | None] = {}
    num_bytes = 0
    for key in ("session", "response"):
        inner = message.get(key) if isinstance(message, Mapping) else None
        listed = inner.get("tools") if isinstance(inner, Mapping) else None
        if not isinstance(listed, list) or len(listed) > limits.max_tools:
            continue  # none, or too many: refused before any is compiled
        for value in listed:
            parameters = value.get("parameters") if isinstance(value, Mapping) else None
            if not isinstance(parameters, Mapping):
                continue
            deep = depth_of(parameters, limits.max_schema_depth) > limits.max_schema_depth
            if deep or ref_cycle(parameters) is not None:
                continue  # refused before it is compiled
            lark = tool_call_lark([FunctionTool(str(value.get("name")), "", parameters)])
            num_bytes += len(lark)
            if num_bytes > 2 * limits.max_tools_bytes:
                break
            verdicts[lark] = grammar_problem(lark)
    return verdicts
