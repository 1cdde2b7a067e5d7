"""What a stage actor holds between planning a round and applying it (``_actor.py``): the
round itself, the actor's counters, and the record of a hang."""

from __future__ import annotations

from dataclasses import dataclass, field

import outcome

from ._runner import Plan, Result
from ._slot import Slot

MAX_ROUNDS_OUT = 2
"""The running round and the next one, planned and queued behind it."""


@dataclass(eq=False, slots=True)
class Round:
    """A plan handed to the thread, and what it holds, until its result is applied."""

    plan: Plan
    batch: tuple[Slot, ...]  # the slots of plan.batch, in order (their credit is reserved)
    opens: tuple[Slot, ...]
    since: float  # trio time it became the oldest round out (the watchdog's start)
    result: outcome.Outcome[Result] | None = None
    tried: set[str] = field(default_factory=set)  # streams the actor tried to put in it
    started: bool = False  # the actor found its execution started: nothing joins it now

    @property
    def has_work(self) -> bool:
        return bool(self.plan.closes or self.opens or self.batch)


EMPTY_ROUND = Round(Plan((), (), ()), (), (), 0.0)


@dataclass
class Counters:
    """What the actor counts for ``StageStatistics``."""

    num_steps: int = 0
    num_batched: int = 0
    largest_batch_size: int = 0
    last_batch_size: int = 0
    num_skipped_no_credit: int = 0
    num_payloads_sent: int = 0
    num_visible_sent: int = 0
    num_stream_failures: int = 0
    num_step_failures: int = 0
    num_empty_plans: int = 0
    num_behind_deadline: int = 0
    busy_s: float = 0.0
    trio_s: float = 0.0
    idle_s: float = 0.0


@dataclass
class Hang:
    """The stage is out of service: a step outlived ``step_timeout_s``."""

    round: Round
    problem: str
    closes: list[str] = field(default_factory=list)
