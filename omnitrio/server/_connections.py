"""The server's connection budget: how many TCP connections it holds, and the refusal
of one more.

Every open connection, idle ones included, holds a file descriptor. Past the
process's limit ``accept`` fails with EMFILE: trio logs a traceback and retries,
and meanwhile ``/health``, new turns and the model files the stages open all
fail. So the server counts its connections and answers the first one past
``effective_max_connections`` with a complete ``503`` and closes it, while the
fds it keeps in reserve are still free.

One client (a peer address, as in ``_shares.py``) holds at most
``max_connections_per_client`` of them (by default a sixteenth of the server's, at
least 8): one address holding 1,000 idle Realtime sessions refused every other client.
One more from it is answered ``429`` (``too_many_connections``, naming the setting,
``retry-after``) and closed, and the others still find room.

``on_crowded`` is told when the server comes to hold ``CROWDED_FRACTION`` of its
connections and when it is back to ``CALM_FRACTION``: meanwhile idle sessions are
closed sooner (``_idle_sessions.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections import Counter
from collections.abc import Callable

import trio

from ._idle_sessions import CALM_FRACTION, CROWDED_FRACTION

logger = logging.getLogger(__name__)

ATTRIBUTE = "omnitrio_connection_slots"
REFUSAL_WRITE_S = 1.0
"""How long a refusal may take to write before the connection is simply closed."""


def connections_per_client(max_connections: int, setting: int | None) -> int:
    """``max_connections_per_client``, or a sixteenth of ``max_connections`` (at least 8)."""
    return setting if setting is not None else max(8, max_connections // 16)


class ConnectionSlots:
    """Counts open connections against a limit, and each client's against its own;
    shared by every connection task."""

    def __init__(self, max_connections: int, max_per_client: int | None = None) -> None:
        self.max_connections = max_connections
        self.max_per_client = connections_per_client(max_connections, max_per_client)
        self.open = 0
        self.num_refused = 0
        self.num_refused_client = 0
        self.per_client: Counter[str] = Counter()
        self.crowded_at = max(1, math.ceil(max_connections * CROWDED_FRACTION))
        self.calm_at = min(self.crowded_at - 1, math.floor(max_connections * CALM_FRACTION))
        self.on_crowded: Callable[[bool], None] | None = None

    def take_for(self, client: str) -> bytes | None:
        """Take a slot for a new connection from ``client``; None when taken, else the
        refusal to send (a 503 when the server is full, a 429 past the client's share)."""
        if not self.take():
            return refusal_bytes(self.max_connections)
        if self.per_client[client] >= self.max_per_client:
            self.give_back()
            self.num_refused_client += 1
            if self.num_refused_client % 1000 == 1:
                logger.warning(
                    "a client holds %d connections, its limit (max_connections_per_client); "
                    "refusing its new ones with 429 (%d refused so far)",
                    self.per_client[client],
                    self.num_refused_client,
                )
            return client_refusal_bytes(self.max_per_client)
        self.per_client[client] += 1
        return None

    def give_back_for(self, client: str) -> None:
        self.give_back()
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

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
        if self.open == self.crowded_at and self.on_crowded is not None:
            self.on_crowded(True)
        return True

    def give_back(self) -> None:
        self.open -= 1
        if self.open == self.calm_at and self.on_crowded is not None:
            self.on_crowded(False)


def refusal_bytes(max_connections: int) -> bytes:
    """A complete HTTP/1.1 503 that names the limit (OpenAI-style error body)."""
    message = f"the server holds its limit of {max_connections} connections; retry later"
    return _error_bytes("503 Service Unavailable", "server_error", message)


def client_refusal_bytes(max_per_client: int) -> bytes:
    """A complete HTTP/1.1 429: this client holds its share of the connections."""
    message = (
        f"this client already has {max_per_client} connections open, its share of the "
        f"server (max_connections_per_client={max_per_client}); close one and retry"
    )
    return _error_bytes("429 Too Many Requests", "rate_limit_error", message)


def _error_bytes(status: str, kind: str, message: str) -> bytes:
    error = {
        "message": message,
        "type": kind,
        "param": None,
        "code": "too_many_connections",
    }
    body = json.dumps({"error": error}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"retry-after: 1\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def refuse(stream: trio.abc.Stream, refusal: bytes) -> None:
    """Send ``refusal`` (within ``REFUSAL_WRITE_S``) and close ``stream``."""
    with trio.move_on_after(REFUSAL_WRITE_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(refusal)
    await stream.aclose()


def peer_of(stream: trio.abc.Stream) -> str:
    """The client a connection belongs to: its peer's address (``_shares.client_of``)."""
    sock = getattr(stream, "socket", None)
    try:
        peer = sock.getpeername() if sock is not None else None
    except OSError:
        peer = None
    return str(peer[0]) if isinstance(peer, tuple) else "unknown"
