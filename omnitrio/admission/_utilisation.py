"""A stage's busy fraction lately, and admission by it (``admission: busy``).

The step-time model (``_headroom.py``) charges every active stream one step per round
and reads audio per stream-step; a stage whose steps mostly carry no audio (a voice
chat's TTS, most of whose steps take a text delta) reads slower than real time while
it is mostly idle. Admission by utilisation counts the work the stage actually has:
its busy fraction lately, ``b`` (steps' wall time over wall time, the past halved
every ``BUSY_HALF_LIFE_S``), for its ``n`` active streams. One more stream of the
same kind is about ``b / n`` more, so a stream is refused while, with it, some stage
would be busy more than ``1 / (1 + realtime_margin)`` of the time:
``b x (n + 1) / n`` (``b`` itself when nothing is active there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ._headroom import StepModel

ActiveCounts = Mapping[str, int] | Callable[[str], int]
"""Each stage's active streams, by name (a mapping, or asked of a function)."""

BUSY_HALF_LIFE_S = 1.0
"""Half-life of the past in a stage's busy fraction."""


@dataclass(slots=True)
class BusyWatch:
    """One stage's busy fraction, updated after each round it applies."""

    at_s: float
    busy_s: float
    busy_fraction: float = 0.0
    below_since_s: float | None = None
    """Since when its realtime factor has been below the shedding threshold (``_shed.py``)."""

    def update(self, now_s: float, busy_s: float) -> None:
        """The stage had been busy ``busy_s`` in all by ``now_s``."""
        elapsed_s = now_s - self.at_s
        if elapsed_s > 0:
            recent = min(1.0, max(0.0, (busy_s - self.busy_s) / elapsed_s))
            keep = 0.5 ** (elapsed_s / BUSY_HALF_LIFE_S)
            self.busy_fraction = self.busy_fraction * keep + recent * (1 - keep)
            self.at_s, self.busy_s = now_s, busy_s

    def fraction_at(self, now_s: float) -> float:
        """The busy fraction at ``now_s``, the time since its last round counted idle
        (a stage that applies no round has no work)."""
        elapsed_s = max(0.0, now_s - self.at_s)
        return self.busy_fraction * float(0.5 ** (elapsed_s / BUSY_HALF_LIFE_S))


def projected_busy(busy_fraction: float, num_active: int) -> float:
    """The stage's busy fraction with one more active stream: ``b x (n + 1) / n``."""
    if num_active <= 0:
        return busy_fraction
    return busy_fraction * (num_active + 1) / num_active


def active_at(num_active: ActiveCounts, stage: str, num_live: int) -> int:
    """``stage``'s active streams, at most ``num_live`` (all of them where unknown)."""
    found = num_active(stage) if callable(num_active) else num_active.get(stage)
    return num_live if found is None else min(num_live, found)


def busy_problem(
    watches: Mapping[str, BusyWatch],
    models: Iterable[tuple[str, StepModel]],
    num_live: int,
    num_active: ActiveCounts | None,
    limit: float,
    now_s: float | None,
) -> str | None:
    """``busy`` admission: why one more stream is refused (None: admit it). Refused
    while, with it, some stage would be busy more than ``limit`` of the time."""
    for name, _ in models:
        watch = watches.get(name)
        if watch is None:  # no round applied yet: no opinion
            continue
        fraction = watch.busy_fraction if now_s is None else watch.fraction_at(now_s)
        active = num_live if num_active is None else active_at(num_active, name, num_live)
        projected = projected_busy(fraction, active)
        if projected > limit:
            return (
                f"with {active + 1} active streams stage {name!r} would be busy "
                f"{projected:.0%} of the time (pipeline.realtime_margin asks for at "
                f"most {limit:.0%})"
            )
    return None
