"""Which streams a stage steps next: pure decisions, no trio, no threads.

A stream is *ready* at a stage when it has work (new input, its input just
closed, or the stage asked for ``more``) and *fits* when each channel it would
write to has room for a whole step's output. Only ready streams that fit are
batched; a ready stream that does not fit is skipped and counted, never waited
for, so one slow client cannot hold up anybody else's batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the scheduler needs to know about one stream at one stage."""

    stream_id: str
    has_work: bool
    fits: bool
    last_step: int
    """Number of the stage step that last included the stream (-1: never)."""


@dataclass(frozen=True, slots=True)
class Decision:
    batch: tuple[str, ...]
    num_skipped_no_credit: int


def pick_batch(candidates: Sequence[Candidate], max_batch_size: int) -> Decision:
    """Least recently stepped first, up to ``max_batch_size`` streams that have work and fit."""
    runnable = [c for c in candidates if c.has_work and c.fits]
    runnable.sort(key=lambda c: c.last_step)
    skipped = sum(1 for c in candidates if c.has_work and not c.fits)
    return Decision(tuple(c.stream_id for c in runnable[:max_batch_size]), skipped)
