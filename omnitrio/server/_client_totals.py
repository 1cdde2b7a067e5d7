"""One client's totals across its Realtime sessions: the memory they hold of what it
sent, and the sessions open under one credential.

Each session has its own limits (60 s of uncommitted audio, 1 MiB of conversation
text, instructions under the message limit), but one client filling them in every
session it may open held 3.3-3.9 MB a session: 300 sessions +1 GB (issue 42, attack
11). So the server also keeps, per client (a peer address, as ``_shares.py`` does):

- **held bytes**: what its sessions hold of its input (``RealtimeSession.held_bytes``:
  audio appended or committed, conversation text, instructions), summed over its
  sessions, at most ``max_client_held_bytes``. A frame that would take the client
  past it and that adds to what a session holds (an append, an item, a session
  update) is refused with an ``error`` event (``client_memory_full``) that says how
  to make room; frames that free or use what is held (commit, clear, delete,
  truncate, response.create) always pass, so a full client can always make room.
- **sessions per credential**: the sessions open with one API key at once (WebRTC
  calls included: ``_calls.py`` counts each here until it ends), at most
  ``max_sessions_per_key`` (None: not counted by key; the server's one key is
  usually shared by every backend that holds it, so the per-address count is the
  one on by default). One more is refused (``SessionRefused``, with a retry hint).

Only digests of keys are kept.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Mapping

from ..realtime import ClientEventError, ServerEvent, SessionConfig
from ..realtime._encode import decode_frame
from ..realtime._events import client_event_id
from ..realtime._server_events import error_event

logger = logging.getLogger(__name__)

GROWING_EVENTS = frozenset(
    {"input_audio_buffer.append", "conversation.item.create", "session.update"}
)
"""Client events that add to what a session holds (refused when the client is full)."""
SESSION_RETRY_AFTER_S = 5


class SessionRefused(Exception):
    """A new session past a per-client total; ``str()`` says which and how to retry."""

    def __init__(self, message: str, retry_after_s: int = SESSION_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ClientTotals:
    """The server's per-client totals (see the module docstring); one per server."""

    def __init__(self, max_held_bytes: int, max_sessions_per_key: int | None) -> None:
        self.max_held_bytes = max_held_bytes
        self.max_sessions_per_key = max_sessions_per_key
        self.held: Counter[str] = Counter()  # client -> bytes its sessions hold
        self.sessions_by_key: Counter[str] = Counter()  # key digest -> sessions open
        self.num_refused_events = 0
        self.num_refused_sessions = 0

    def open_session(self, client: str, key: str | None) -> SessionTotals:
        """Count a session of ``client`` opened with ``key`` (None: none was needed) until
        its ``close``; ``SessionRefused`` when the key holds its share already."""
        digest = None
        if key is not None and self.max_sessions_per_key is not None:
            digest = hashlib.sha256(key.encode()).hexdigest()
            if self.sessions_by_key[digest] >= self.max_sessions_per_key:
                self.num_refused_sessions += 1
                raise SessionRefused(
                    f"this API key already has {self.max_sessions_per_key} sessions open "
                    f"(max_sessions_per_key); close one and retry in {SESSION_RETRY_AFTER_S} s"
                )
            self.sessions_by_key[digest] += 1
        return SessionTotals(self, client, digest)


class SessionTotals:
    """One session's part in its client's totals."""

    def __init__(self, totals: ClientTotals, client: str, key_digest: str | None) -> None:
        self._totals = totals
        self._client = client
        self._key_digest = key_digest
        self.held_bytes = 0

    def close(self) -> None:
        """The session has ended: it holds nothing, and its key has one session less."""
        self.update(0)
        digest, counts = self._key_digest, self._totals.sessions_by_key
        if digest is not None:
            self._key_digest = None
            counts[digest] -= 1
            if counts[digest] <= 0:
                del counts[digest]

    def update(self, held_bytes: int) -> None:
        """The session now holds ``held_bytes`` of its client's input."""
        totals, client = self._totals, self._client
        totals.held[client] += held_bytes - self.held_bytes
        self.held_bytes = held_bytes
        if totals.held[client] <= 0:
            del totals.held[client]

    def refusal(self, frame: str | bytes, config: SessionConfig) -> ServerEvent | None:
        """The ``error`` event refusing ``frame``, when it could take the client past its
        total and adds to what a session holds; None: let the session have it."""
        totals = self._totals
        held = totals.held[self._client]
        if held + len(frame) <= totals.max_held_bytes:
            return None  # the common case: nothing decoded here
        try:
            message = decode_frame(
                frame, config.framing, config.max_message_bytes, config.max_frame_values
            )
        except ClientEventError:
            return None  # the session refuses it itself
        kind = message.get("type") if isinstance(message, Mapping) else None
        if kind not in GROWING_EVENTS:
            return None
        totals.num_refused_events += 1
        if totals.num_refused_events % 1000 == 1:
            logger.warning(
                "a client's sessions hold %d bytes, near max_client_held_bytes (%d); "
                "refusing what adds to them (%d refused so far)",
                held,
                totals.max_held_bytes,
                totals.num_refused_events,
            )
        error = ClientEventError(
            "client_memory_full",
            f"this client's sessions hold {held} bytes of its input, and this {kind} "
            f"would take them past max_client_held_bytes ({totals.max_held_bytes}); "
            "commit or clear audio, delete items or close a session, then retry",
        )
        return error_event(error, client_event_id(message))
