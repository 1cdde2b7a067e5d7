"""The two kinds of protocol error, h11 style.

``LocalProtocolError`` is *your* error: the server called the session wrongly
(output for a response that is not active, ``receive`` before ``start``). It is
raised, because it is a bug to fix.

``ClientEventError`` is *the peer's* error: a client event broke the protocol.
It never leaves ``RealtimeSession.receive``; the session turns it into an
``error`` server event and stays usable.
"""

from __future__ import annotations

from typing import Literal

from .._errors import OmnitrioError

ErrorCode = Literal[
    "message_too_large",
    "wrong_frame_type",
    "invalid_json",
    "invalid_msgpack",
    "invalid_event",
    "unknown_event_type",
    "unsupported_event_type",
    "missing_required_parameter",
    "invalid_type",
    "invalid_value",
    "unknown_parameter",
    "unsupported_parameter",
    "invalid_base64",
    "input_audio_buffer_full",
    "input_audio_buffer_commit_empty",
    "conversation_already_has_active_response",
    "response_cancel_not_active",
    "item_not_found",
    "duplicate_item_id",
    "conversation_too_large",
    "item_in_progress",
    "client_memory_full",
]

MAX_ECHO_CHARS = 64
"""Client text quoted back in an error message is cut to this many characters."""


class LocalProtocolError(OmnitrioError):
    """The server used a ``RealtimeSession`` against its contract (a bug in the server)."""


class ClientEventError(Exception):
    """A client event broke the protocol; becomes an ``error`` event, never escapes."""

    def __init__(self, code: ErrorCode, message: str, *, param: str | None = None) -> None:
        self.code: ErrorCode = code
        self.message = message
        self.param = param
        super().__init__(message)


def quote(text: str) -> str:
    """``text`` as a short repr for an error message (client text can be megabytes)."""
    if len(text) <= MAX_ECHO_CHARS:
        return repr(text)
    return repr(text[:MAX_ECHO_CHARS]) + "..."
