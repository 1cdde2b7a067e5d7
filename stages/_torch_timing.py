"""Per-step timing of an autoregressive stage: the critical path versus packaging."""

from __future__ import annotations

import time
from typing import Protocol


class _Packaging(Protocol):
    def times_s(self) -> tuple[float, float, int]: ...


class StepClock:
    """Forward, sampling and packaging time, and the gap between step starts."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.compute_s = 0.0
        self.sampling_s = 0.0
        self.gap_s = 0.0
        self.max_gap_s = 0.0
        self._step_started: float | None = None
        self._first_step: float | None = None
        self.num_tokens = 0

    def start_step(self) -> None:
        now = time.perf_counter()
        if self._step_started is not None:
            gap = now - self._step_started
            self.gap_s += gap
            self.max_gap_s = max(self.max_gap_s, gap)
        self._step_started = now
        if self._first_step is None:
            self._first_step = now
        self.num_steps += 1

    def add_sampling(self, seconds: float, num_tokens: int = 1) -> None:
        self.sampling_s += seconds
        self.num_tokens += num_tokens

    def end_compute(self) -> None:
        assert self._step_started is not None
        self.compute_s += time.perf_counter() - self._step_started

    def snapshot(self, packaging: _Packaging) -> dict[str, float]:
        steps = max(self.num_steps, 1)
        _, total_s, num_jobs = packaging.times_s()
        running_s = time.perf_counter() - self._first_step if self._first_step else 0.0
        return {
            "num_tokens": self.num_tokens,
            "tokens_per_s": self.num_tokens / running_s if running_s else 0.0,
            "num_steps": self.num_steps,
            "forward_ms_mean": 1000 * (self.compute_s - self.sampling_s) / steps,
            "sampling_ms_mean": 1000 * self.sampling_s / steps,
            "packaging_ms_mean": 1000 * total_s / max(num_jobs, 1),
            "step_gap_ms_mean": 1000 * self.gap_s / max(self.num_steps - 1, 1),
            "step_gap_ms_max": 1000 * self.max_gap_s,
        }
