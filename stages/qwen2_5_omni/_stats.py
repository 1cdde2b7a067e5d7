"""Per-step timing of an autoregressive stage, read with ``statistics()``."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ARStageStatistics:
    """A snapshot. Times are seconds; ``*_mean_s`` average over steps that did that work."""

    num_steps: int
    num_active_streams: int
    last_batch_size: int
    max_batch_size: int
    num_tokens: int
    tokens_per_s: float  # tokens / time inside step()
    kv_bytes: int
    forward_mean_s: float
    sampling_mean_s: float
    packaging_mean_s: float  # per packaging job, on the packaging thread
    step_gap_mean_s: float  # between consecutive step starts
    step_mean_s: float  # inside step(), packaging excluded (it runs beside it)


class StepClock:
    """Accumulates what ``ARStageStatistics`` reports; used on the stage's thread only."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.num_tokens = 0
        self.last_batch_size = 0
        self.max_batch_size = 0
        self.forward_s = 0.0
        self.num_forwards = 0
        self.sampling_s = 0.0
        self.num_samplings = 0
        self.step_s = 0.0
        self.gap_s = 0.0
        self.num_gaps = 0
        self._last_start: float | None = None

    def step_started(self) -> float:
        now = time.perf_counter()
        if self._last_start is not None:
            self.gap_s += now - self._last_start
            self.num_gaps += 1
        self._last_start = now
        self.num_steps += 1
        return now

    def snapshot(
        self, *, num_active: int, kv_bytes: int, packaging: tuple[float, float, int]
    ) -> ARStageStatistics:
        _, packaging_total_s, num_jobs = packaging
        return ARStageStatistics(
            num_steps=self.num_steps,
            num_active_streams=num_active,
            last_batch_size=self.last_batch_size,
            max_batch_size=self.max_batch_size,
            num_tokens=self.num_tokens,
            tokens_per_s=self.num_tokens / self.step_s if self.step_s else 0.0,
            kv_bytes=kv_bytes,
            forward_mean_s=_mean(self.forward_s, self.num_forwards),
            sampling_mean_s=_mean(self.sampling_s, self.num_samplings),
            packaging_mean_s=_mean(packaging_total_s, num_jobs),
            step_gap_mean_s=_mean(self.gap_s, self.num_gaps),
            step_mean_s=_mean(self.step_s, self.num_steps),
        )


def _mean(total: float, count: int) -> float:
    return total / count if count else 0.0
