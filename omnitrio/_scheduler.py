"""Which streams a stage steps next: pure decisions, no trio, no threads.

A stream is *ready* at a stage when it has work (new input, its input just
closed, or the stage asked for ``more``) and *fits* when each channel it would
write to has room for a whole step's output. Only ready streams that fit are
batched; a ready stream that does not fit is skipped and counted, never waited
for, so one slow client cannot hold up anybody else's batch.

Candidates come least recently stepped first (the actor keeps its streams in
that order), and are consumed lazily: the scan stops once the batch is full, so
a turn costs O(batch), not O(open streams).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple


class Candidate(NamedTuple):
    """What the scheduler needs to know about one stream at one stage. (A named tuple,
    not a frozen dataclass: one is made per ready stream per plan, and a frozen
    dataclass costs several times as much to build.)"""

    stream_id: str
    has_work: bool
    fits: bool


@dataclass(frozen=True, slots=True)
class Decision:
    batch: tuple[str, ...]
    skipped: tuple[str, ...]
    """Streams with work that did not fit (seen before the batch filled)."""


def pick_batch(candidates: Iterable[Candidate], max_batch_size: int) -> Decision:
    """The first ``max_batch_size`` candidates that have work and fit, in the given order."""
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
