"""Realtime frames that carry tools, checked off the event loop before the session
sees them.

The Realtime session (``omnitrio.realtime``) is sans-io and runs on the event loop;
checking a frame's tools compiles each one's schema (about a millisecond a tool),
which is too long to do there. A frame that may carry tools (``session.update``,
``response.create``) is first decoded and its tools checked on a checking thread
(``ClientShares.off_loop``): ``omnitrio.tools.check_tools`` keeps each tool's
result, so when the session checks the same tools on the loop a moment later they
cost a look-up. Whatever is wrong with the frame, the session reports; this only
does the slow part early.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from ..realtime import SessionConfig
from ..realtime._encode import decode_frame
from ..realtime._errors import ClientEventError
from ..tools import FunctionTool, ToolError, check_tools


def may_carry_tools(frame: str | bytes | None) -> bool:
    """Cheap: can this frame hold a ``tools`` field at all?"""
    if isinstance(frame, str):
        return '"tools"' in frame
    return frame is not None and b"tools" in frame


def precheck_tools(frame: str | bytes, config: SessionConfig) -> None:
    """Check the tools of ``frame`` (a session's or a response's), for the cache."""
    try:
        message = decode_frame(
            frame, config.framing, config.max_message_bytes, config.max_frame_values
        )
    except ClientEventError:
        return  # the session refuses it again, cheaply
    if not isinstance(message, Mapping):
        return
    for key in ("session", "response"):
        inner = message.get(key)
        listed = inner.get("tools") if isinstance(inner, Mapping) else None
        if not isinstance(listed, list):
            continue
        tools = [
            FunctionTool(str(t.get("name")), str(t.get("description") or ""), t["parameters"])
            for t in listed[: config.tool_limits.max_tools + 1]
            if isinstance(t, Mapping) and isinstance(t.get("parameters"), Mapping)
        ]
        with contextlib.suppress(ToolError):  # the session names the field
            check_tools(tools, config.tool_limits)
