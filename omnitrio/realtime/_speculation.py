"""The speculative answer's state: which request runs ahead of its turn's end, unseen.

With server VAD the detector reports a short pause (``speech_paused``) before the
silence is long enough to end the turn. The session then says what the turn's
response would ask for (``Speculate``: the server may run that request now and keep
its items to itself). Speech resuming, a new pause or a restarted detector drops it
(``DropSpeculation``: the server closes that stream, and nothing of it is sent).
When a response starts, it takes the speculation over only if its request is
*equal* (same conversation, audio and options): its ``StartResponse`` then names the
speculation, and the server sends the kept items first; otherwise the speculation is
dropped and the response runs as always.

``SpeculationState`` holds at most one speculation and decides these transitions;
the session owns one. It does no I/O: the server keeps the stream's resources,
keyed by ``speculation_id``, and does what the outputs say.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._items import Request
from ._server_events import new_id


@dataclass(frozen=True)
class Speculate:
    """The server may run ``request`` now as ``speculation_id``, keeping its items unseen."""

    speculation_id: str
    request: Request


@dataclass(frozen=True)
class DropSpeculation:
    """The server must close speculation ``speculation_id``'s stream; none of it is sent."""

    speculation_id: str


class SpeculationState:
    """The one speculation a session holds, if any (see the module docstring)."""

    def __init__(self) -> None:
        self._held: Speculate | None = None

    @property
    def held(self) -> Speculate | None:
        return self._held

    def hold(self, request: Request) -> list[Speculate | DropSpeculation]:
        """Speculate on ``request``, dropping the one held before."""
        speculate = Speculate(new_id("spec"), request)
        drops = self.drop()
        self._held = speculate
        return [*drops, speculate]

    def drop(self) -> list[DropSpeculation]:
        """Drop the speculation held, if any."""
        held, self._held = self._held, None
        return [] if held is None else [DropSpeculation(held.speculation_id)]

    def take(self, request: Request) -> tuple[str | None, list[DropSpeculation]]:
        """A response for ``request`` starts: the speculation it takes over (its id, when
        the held one ran an equal request), and the drops (the held one, when not)."""
        held = self._held
        if held is not None and held.request == request:
            self._held = None
            return held.speculation_id, []
        return None, self.drop()
