"""One stream at one stage: its lifecycle as an explicit state machine.

A stage actor keeps a ``Slot`` per stream it serves. The slot's ``phase`` says
where the stream's state on the stage object is; every change goes through
``Slot.on``, which looks the (phase, event) pair up in ``TRANSITIONS`` and
raises ``IllegalTransition`` (a runtime bug, loud) for any pair not in it::

    NEW --plan_open--> OPENING --opened--> OPEN --closed--> CLOSED --released--> RELEASED
     |                   |  \\--open_failed--> CLOSED           ^
     |                   end                  |                 |
     |                   v                    end               |
     \\--end--> CLOSED   ENDING <--------------/                 |
                         |--plan_close--> CLOSING --closed------/
                         \\--closed / open_failed--> CLOSED

``ended_empty`` takes NEW to CLOSED too: its input ended with no item at a stage
that ``ends_without_input``. ``end`` is the stream failing or being cancelled
anywhere; ``closed`` is the worker reporting ``close_stream`` ran (the stage
finished the stream, it failed there, or a planned close ran). A slot leaves for
good (``released``) only from CLOSED and only once no round out holds it
(``in_flight == 0``); the watchdog and shutdown ``abandon`` a slot from any phase.

**Which copy is the authority.** The worker thread's ``StageRunner`` keeps its
own record of the streams the stage object holds (``_held``) and of what each
one's latest step said (``_more``, ``_told_closed``): it sees every step the
moment it returns, so *it* decides whether ``close_stream`` runs (exactly once)
and whether a planned stream is stepped at all. The trio side's ``Slot`` is the
authority on the stream's life in the runtime (admission, credit, release) and
holds a forecast of the runner's view (``more``, ``told_closed``), one round
behind at most: trio plans on the forecast, the runner corrects it by sitting a
stream out, and the forecast is brought up to date when the round comes back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ._link import Link
from ._stream import StreamState
from .admission import StreamFlow


class Phase(enum.Enum):
    NEW = "new"
    """Added; its ``open_stream`` is not planned yet."""
    OPENING = "opening"
    """Its ``open_stream`` is in a round out."""
    OPEN = "open"
    """The stage holds its state: it may be stepped."""
    ENDING = "ending"
    """The stream ended (failed or cancelled) while the stage held or was opening it:
    a close is planned once no round out holds it."""
    CLOSING = "closing"
    """Its ``close_stream`` is in a round out."""
    CLOSED = "closed"
    """The stage no longer holds it (closed, or never opened); freed once no round
    out holds it."""
    RELEASED = "released"
    """Gone from the actor; the stream was told (``released_by``)."""


class Event(enum.Enum):
    PLAN_OPEN = "plan_open"
    OPENED = "opened"
    OPEN_FAILED = "open_failed"
    END = "end"
    ENDED_EMPTY = "ended_empty"
    PLAN_CLOSE = "plan_close"
    CLOSED = "closed"
    RELEASE = "release"
    ABANDON = "abandon"  # watchdog, lost process, shutdown: freed from any phase


P, E = Phase, Event
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (P.NEW, E.PLAN_OPEN): P.OPENING,
    (P.NEW, E.END): P.CLOSED,
    (P.NEW, E.ENDED_EMPTY): P.CLOSED,
    (P.OPENING, E.OPENED): P.OPEN,
    (P.OPENING, E.OPEN_FAILED): P.CLOSED,
    (P.OPENING, E.END): P.ENDING,
    (P.OPENING, E.CLOSED): P.CLOSED,  # its process died with a round out (StageLost)
    (P.OPEN, E.END): P.ENDING,
    (P.OPEN, E.CLOSED): P.CLOSED,
    (P.ENDING, E.END): P.ENDING,
    (P.ENDING, E.OPENED): P.ENDING,  # ended while its open was out: close it next
    (P.ENDING, E.OPEN_FAILED): P.CLOSED,
    (P.ENDING, E.PLAN_CLOSE): P.CLOSING,
    (P.ENDING, E.CLOSED): P.CLOSED,  # a step out when it ended finished it
    (P.CLOSING, E.END): P.CLOSING,
    (P.CLOSING, E.CLOSED): P.CLOSED,
    (P.CLOSED, E.END): P.CLOSED,
    (P.CLOSED, E.CLOSED): P.CLOSED,  # a planned close of a stream a step had closed
    (P.CLOSED, E.OPEN_FAILED): P.CLOSED,  # its process died before its open came back
    (P.CLOSED, E.RELEASE): P.RELEASED,
    **{(phase, E.ABANDON): P.RELEASED for phase in Phase if phase is not P.RELEASED},
}
del P, E

HOLDING = frozenset({Phase.OPENING, Phase.OPEN, Phase.ENDING, Phase.CLOSING})
"""Phases in which the stage object holds (or is about to hold) the stream's state."""


class IllegalTransition(RuntimeError):
    """A slot was driven through a (phase, event) pair not in ``TRANSITIONS``."""


@dataclass(eq=False, slots=True)
class Slot:
    """One stream as one stage sees it."""

    stream: StreamState
    in_link: Link | None  # None for the first stage
    out_link: Link | None  # None for the last stage (or a side stage)
    phase: Phase = Phase.NEW
    in_flight: int = 0
    """Rounds out (planned, not applied) that open or step it."""
    more: bool = False
    """Forecast: the stage's latest answer for it asked for another step."""
    told_closed: bool = False
    """Forecast: the stage has been stepped with its input closed."""
    waiting: bool = False
    """The actor's wake-up is on one of its links, for credit."""
    num_steps: int = 0
    """Steps whose output it got (what the step-time model's audio per step learns)."""
    flow: StreamFlow = field(default_factory=StreamFlow)
    """Its steps and audio since its first audio (the yield before any completion)."""
    worked_at_s: float = 0.0
    """When a plan last saw it with work (perf_counter s; at first, when it was added):
    a stream idle here longer than ``admission.ACTIVE_WINDOW_S`` is not charged a step."""
    carry: tuple[object, ...] = ()
    """Inputs taken for a step it was then left out of (a newcomer took its place in a
    queued round): they go first into its next step."""
    first_input_s: float | None = None
    """When the actor first saw its first input here (perf_counter s), until its first step."""
    steps_to_first: int = 0
    """The stage's steps that ended after ``first_input_s``: those it waited for."""

    @property
    def id(self) -> str:
        return self.stream.id

    def on(self, event: Event) -> Phase:
        """Apply ``event``; returns the new phase."""
        try:
            self.phase = TRANSITIONS[self.phase, event]
        except KeyError:
            raise IllegalTransition(
                f"stream {self.stream.id!r}: {event.value} in phase {self.phase.value}"
            ) from None
        return self.phase

    @property
    def releasable(self) -> bool:
        """Closed on the stage and no round out holds it."""
        return self.phase is Phase.CLOSED and not self.in_flight

    @property
    def steppable(self) -> bool:
        return self.phase is Phase.OPEN or (self.phase is Phase.OPENING and self.in_flight > 0)
