"""The server's heap trims (omnitrio/_heap.py): after an HTTP request or WebSocket
session that moved at least ``TRIM_AFTER_BYTES`` either way has ended, the memory it
freed is handed back to the system (``HeapTrims``: off the event loop, one trim at a
time, coalesced).

An ASGI wrapper around the app: it adds up the bodies of the request and the
response (``http.request`` / ``http.response.body``) and the WebSocket messages
(``bytes``, or ``text`` in characters) as they pass, a ``len`` each, and trims once
the app has returned, so what the request or session held is already freed. It is
the size of what was moved that marks the work as big: a 1 MB prompt, a session full
of input, a long answer's audio (Piper's working set for a phrase at its phoneme cap,
issue 42 attack 4, is freed by then too). A small request never trims.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

from .._heap import HeapTrims

TRIM_AFTER_BYTES = 128 * 1024  # a 56 s mp3 upload is 236 KB, a voice turn of 2 s ~128 KB


def _size(message: ASGIReceiveEvent | ASGISendEvent) -> int:
    """The payload of an ASGI message: a body, or a WebSocket message's bytes or text."""
    fields = cast(Mapping[str, object], message)
    size = 0
    for key in ("body", "bytes", "text"):
        value = fields.get(key)
        if isinstance(value, (bytes, bytearray, str)):
            size += len(value)
    return size


def trimming_after_big(
    app: ASGIFramework, trims: HeapTrims, min_bytes: int = TRIM_AFTER_BYTES
) -> ASGIFramework:
    """``app``, trimming the heap after each HTTP request or WebSocket session that
    moved at least ``min_bytes`` (see the module docstring)."""

    async def wrapped(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        moved = 0

        async def counted_receive() -> ASGIReceiveEvent:
            nonlocal moved
            message = await receive()
            moved += _size(message)
            return message

        async def counted_send(message: ASGISendEvent) -> None:
            nonlocal moved
            moved += _size(message)
            await send(message)

        await app(scope, counted_receive, counted_send)
        if moved >= min_bytes:
            await trims.trim()

    return wrapped
