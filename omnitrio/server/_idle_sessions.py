"""Idle Realtime sessions are closed sooner when the server is near its connection limit.

A session may last ``max_session_s`` (an hour), idle or not; one client holding 1,000
idle sessions refused every other (issue 42, attack 8). The per-client connection
share (``_connections.py``) bounds one address; this frees the room that many idle
clients hold together. Once the server holds ``CROWDED_FRACTION`` of its connections,
until it is back to ``CALM_FRACTION`` (``ConnectionSlots`` says when), a WebSocket
session that has had no frame from its client for ``crowded_idle_s`` and has no
response running is closed with 1013 ("try again later", the reason naming the
setting): the longest idle first, as many as bring the server back to calm, which
lifts every pending deadline. A session is idle since its client's last frame.
WebRTC calls are not counted here: their media watchdog ends a silent one.

Event-driven: each waiting read has a cancel scope whose deadline is moved when the
crowding changes, so nothing polls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import trio

CROWDED_FRACTION = 0.9
"""The server is crowded once it holds this share of ``max_connections`` ..."""
CALM_FRACTION = 0.75
"""... until it holds no more than this share."""


class IdleSessions:
    """The sessions waiting for their client's next frame; one per server."""

    def __init__(self, crowded_idle_s: float) -> None:
        self.crowded_idle_s = crowded_idle_s
        self.crowded = False
        self.num_closed = 0  # counted by the caller, which decides to close
        self._waiting: dict[trio.CancelScope, float] = {}  # scope -> waiting since

    def set_crowded(self, crowded: bool) -> None:
        """The server is (or is no longer) near its connection limit."""
        if crowded == self.crowded:
            return
        self.crowded = crowded
        for scope, since in self._waiting.items():
            scope.deadline = self._deadline(since)

    def _deadline(self, since: float) -> float:
        return since + self.crowded_idle_s if self.crowded else math.inf

    @contextmanager
    def waiting(self) -> Iterator[trio.CancelScope]:
        """Wait for the client's next frame inside this block; the scope is cancelled
        (``cancelled_caught``) when the session has idled too long on a crowded server."""
        since = trio.current_time()
        scope = trio.CancelScope(deadline=self._deadline(since))
        self._waiting[scope] = since
        try:
            with scope:
                yield scope
        finally:
            del self._waiting[scope]
