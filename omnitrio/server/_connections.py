"""The server's connection budget: how many TCP connections it holds, and the refusal
of one more.

Every open connection, idle ones included, holds a file descriptor. Past the
process's limit ``accept`` fails with EMFILE: trio logs a traceback and retries,
and meanwhile ``/health``, new turns and the model files the stages open all
fail. So the server counts its connections and answers the first one past
``effective_max_connections`` with a complete ``503`` and closes it, while the
fds it keeps in reserve are still free.
"""

from __future__ import annotations

import contextlib
import json
import logging

import trio

logger = logging.getLogger(__name__)

ATTRIBUTE = "omnitrio_connection_slots"
REFUSAL_WRITE_S = 1.0
"""How long a refusal may take to write before the connection is simply closed."""


class ConnectionSlots:
    """Counts open connections against a limit; shared by every connection task."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self.open = 0
        self.num_refused = 0

    def take(self) -> bool:
        """Take a slot for a new connection; False when the server is full."""
        if self.open >= self.max_connections:
            if self.num_refused == 0 or self.num_refused % 1000 == 0:
                logger.warning(
                    "%d connections open, the limit (max_connections); refusing new ones "
                    "with 503 (%d refused so far)",
                    self.open,
                    self.num_refused,
                )
            self.num_refused += 1
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1


def refusal_bytes(max_connections: int) -> bytes:
    """A complete HTTP/1.1 503 that names the limit (OpenAI-style error body)."""
    message = f"the server holds its limit of {max_connections} connections; retry later"
    error = {
        "message": message,
        "type": "server_error",
        "param": None,
        "code": "too_many_connections",
    }
    body = json.dumps({"error": error}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"retry-after: 1\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def refuse(stream: trio.abc.Stream, max_connections: int) -> None:
    """Send the 503 (within ``REFUSAL_WRITE_S``) and close ``stream``."""
    with trio.move_on_after(REFUSAL_WRITE_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(refusal_bytes(max_connections))
    await stream.aclose()
