"""What a placement is (``Placement``), what it reports to (``OnDone``) and how it says
its stage's process died (``StageLost``): shared by ``_placement.py`` (threads, and the
choice of placement) and ``_ray.py`` (Ray actors), so neither imports the other at load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import outcome

from ._runner import Plan, Result
from ._stage import StepLimits

OnDone = Callable[[outcome.Outcome[Result]], None]


class StageLost(RuntimeError):
    """The process that held the stage died (e.g. ``kill -9``): every stream the stage
    held is gone with it. The placement brings the stage back (``restarting``)."""


class Placement(Protocol):
    """What an actor needs of the place its stage runs in."""

    @property
    def restarting(self) -> bool:
        """The stage is being loaded again after ``StageLost``: out of service."""
        ...

    @property
    def pid(self) -> int | None:
        """The id of the process the stage runs in, if not this one."""
        ...

    @property
    def num_payload_bytes_relayed(self) -> int:
        """Bytes of edge payloads copied through this process to or from the stage
        (0 for a thread: payloads never leave the process)."""
        ...

    async def load(self) -> StepLimits:
        """Load the stage; raises ``StageLoadError`` (or ``ConfigError``)."""
        ...

    def submit(self, plan: Plan, on_done: OnDone) -> None:
        """Execute ``plan``; ``on_done(outcome)`` runs later on the trio thread. Never blocks."""
        ...

    def amend(self, build: Callable[[], Plan | None]) -> bool | None:
        """Execute ``build()``'s plan instead of the one last submitted, if its execution
        has not started; ``build`` is called only then, on the trio thread, and
        meanwhile it cannot start (``build`` returns None: keep the plan as it is).
        True: amended now; False: it had started; None: asked, the answer comes later
        (a Ray actor holds the plan while ``build`` runs, or starts it: see ``_ray.py``)."""
        ...

    async def close(self, deadline: float) -> bool:
        """Close every stream the stage holds, then the stage, until trio time
        ``deadline`` (shielded). False if it did not finish in time."""
        ...

    def model_statistics(self) -> Mapping[str, float]:
        """The stage's own figures (``stage_statistics()``), cheap, never blocking."""
        ...
