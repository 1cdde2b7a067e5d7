"""Per-step timing of an autoregressive stage: the critical path versus packaging."""

from __future__ import annotations

import time
from typing import Protocol


class _Packaging(Protocol):
    num_jobs: int
    packaging_s: float


class StepClock:
    """Forward, sampling and packaging time, and the gap between step starts."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.compute_s = 0.0
        self.sampling_s = 0.0
        self.gap_s = 0.0
        self.max_gap_s = 0.0
        self._step_started: float | None = None

    def start_step(self) -> None:
        now = time.perf_counter()
        if self._step_started is not None:
            gap = now - self._step_started
            self.gap_s += gap
            self.max_gap_s = max(self.max_gap_s, gap)
        self._step_started = now
        self.num_steps += 1

    def add_sampling(self, seconds: float) -> None:
        self.sampling_s += seconds

    def end_compute(self) -> None:
        assert self._step_started is not None
        self.compute_s += time.perf_counter() - self._step_started

    def snapshot(self, packaging: _Packaging) -> dict[str, float]:
        steps = max(self.num_steps, 1)
        return {
            "num_steps": self.num_steps,
            "forward_ms_mean": 1000 * (self.compute_s - self.sampling_s) / steps,
            "sampling_ms_mean": 1000 * self.sampling_s / steps,
            "packaging_ms_mean": 1000 * packaging.packaging_s / max(packaging.num_jobs, 1),
            "step_gap_ms_mean": 1000 * self.gap_s / max(self.num_steps - 1, 1),
            "step_gap_ms_max": 1000 * self.max_gap_s,
        }
