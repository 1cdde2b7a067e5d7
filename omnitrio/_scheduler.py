"""Which streams a stage steps next: pure decisions, no trio, no threads.

A stream is *ready* at a stage when it has work (new input, its input just
closed, or the stage asked for ``more``) and *fits* when each channel it would
write to has room for a whole step's output. Only ready streams that fit are
batched; a ready stream that does not fit is skipped and counted, never waited
for, so one slow client cannot hold up anybody else's batch.

**Earliest playback deadline first** (``scheduling: deadline``, the default).
Every stream has a *playback deadline*: when its client runs out of audio (the
first chunk's delivery time plus the seconds of audio delivered since), less
the configured client buffer; before its first audio, its admission time plus
the first-audio budget (so streams that have no audio yet, text-only ones
included, are ordered by age). When more streams are ready than a batch holds,
the batch takes the most urgent: a stream far ahead of its deadline gives its
place to one that is behind. Two rules keep a late stream from starving the
others (seed 001's head-of-line blocking, through the scheduler):

- a stream's *first step at the stage* is the most urgent there is (its first
  item is what its client waits for, and it costs one step);
- a deadline already past counts as *now*: streams that are late share the
  steps (ties keep the given order, least recently stepped first) instead of the
  latest one taking every step until its backlog is gone.

So a newcomer waits at most for the rounds already out, whatever the batch size
and whatever backlog another stream has; and the actor puts a newcomer into the
round queued behind the running one while it has not started (on a thread, or held
in a Ray actor's process while the supervisor amends it; ``displaced`` says whom it
takes the place of in a full batch), so it waits for the running step alone. So does
an open stream's input that comes after the queued round was planned, where that round
does not step it: in a full batch it takes the place of a stream less urgent than
itself only, never of one on its first step.

**Round robin** (``scheduling: round_robin``, the runtime before deadlines):
candidates in the given order, least recently stepped first, read lazily, so
the scan stops once the batch is full.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

Scheduling = Literal["deadline", "round_robin"]


@dataclass(frozen=True, slots=True)
class Playback:
    """How a stream's playback deadline is computed (the config's ``pipeline`` section)."""

    client_buffer_s: float = 0.25
    """Audio a client should still hold when the next audio reaches it."""
    first_audio_budget_s: float = 1.0
    """Before its first audio, a stream's deadline is its admission plus this."""

    def deadline_s(
        self, admitted_at_s: float, first_audio_at_s: float | None, audio_s: float
    ) -> float:
        """When the client runs out of audio, less the buffer (times: perf_counter s)."""
        if first_audio_at_s is None:
            return admitted_at_s + self.first_audio_budget_s
        return first_audio_at_s + audio_s - self.client_buffer_s


class Candidate(NamedTuple):
    """What the scheduler needs to know about one stream at one stage. (A named tuple,
    not a frozen dataclass: one is made per ready stream per plan, and a frozen
    dataclass costs several times as much to build.)"""

    stream_id: str
    has_work: bool
    fits: bool
    deadline_s: float = 0.0
    first: bool = False
    """Its first step at this stage (the most urgent of all)."""


@dataclass(frozen=True, slots=True)
class Decision:
    batch: tuple[str, ...]
    skipped: tuple[str, ...]
    """Streams with work that did not fit (round robin: those seen before the batch filled)."""


def pick_batch(
    candidates: Iterable[Candidate],
    max_batch_size: int,
    scheduling: Scheduling = "round_robin",
    now_s: float = -math.inf,
) -> Decision:
    """Up to ``max_batch_size`` candidates that have work and fit: the most urgent
    (``deadline``: first steps, then the earliest deadlines, one past ``now_s`` counting
    as ``now_s``) or the first in the given order (``round_robin``). The batch lists
    them in the given order."""
    if scheduling == "round_robin":
        return _first_that_fit(candidates, max_batch_size)
    ready: list[Candidate] = []
    skipped: list[str] = []
    for candidate in candidates:
        if not candidate.has_work:
            continue
        if candidate.fits:
            ready.append(candidate)
        else:
            skipped.append(candidate.stream_id)
    if len(ready) > max_batch_size:
        key = partial(urgency, now_s=now_s)
        chosen = {id(c) for c in heapq.nsmallest(max_batch_size, ready, key=key)}
        ready = [c for c in ready if id(c) in chosen]
    return Decision(tuple(c.stream_id for c in ready), tuple(skipped))


def urgency(candidate: Candidate, now_s: float) -> float:
    """Smaller is more urgent: a first step before all, then the deadline, one already
    past counting as ``now_s``."""
    if candidate.first:
        return -math.inf
    deadline_s = candidate.deadline_s
    return now_s if deadline_s < now_s else deadline_s


def displaced(batch: Sequence[Candidate], now_s: float) -> int | None:
    """Which member of a full ``batch`` a newcomer's first step takes the place of (its
    index): the least urgent that is not on its first step, of equals the last given
    (the most recently stepped); None if every one is on its first step."""
    worst: int | None = None
    worst_urgency = -math.inf
    for index, candidate in enumerate(batch):
        if candidate.first:
            continue
        value = urgency(candidate, now_s)
        if worst is None or value >= worst_urgency:
            worst, worst_urgency = index, value
    return worst


def _first_that_fit(candidates: Iterable[Candidate], max_batch_size: int) -> Decision:
    batch: list[str] = []
    skipped: list[str] = []
    for candidate in candidates:
        if not candidate.has_work:
            continue
        if not candidate.fits:
            skipped.append(candidate.stream_id)
            continue
        batch.append(candidate.stream_id)
        if len(batch) == max_batch_size:
            break
    return Decision(tuple(batch), tuple(skipped))
