"""The step-time model of omnitrio's ``stages.synthetic.SyntheticStage``, for the peer.

A step of ``b`` working streams costs ``service_s + per_stream_s * ceil(b / replicas)``
of device time (slept: the GIL is released, as a GPU kernel releases it), plus the
prefill of the streams that start in it, then ``host_s`` of GIL-held host work per
replica that stepped. The same numbers as omnitrio's stage, so the two runtimes run
the same work: see ``stages/synthetic.py`` (``step``, ``_wait_until``, ``hold_gil_for``).
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from dataclasses import dataclass

SLEEP_MARGIN_S = 0.2e-3  # as stages/synthetic.py: sleep to this before the deadline, then poll


@dataclass(frozen=True)
class StepModel:
    service_s: float
    per_stream_s: float
    host_s: float = 0.0
    prefill_s: float = 0.0
    prefill_per_word_s: float = 0.0
    replicas: int = 1
    cpu_bound: bool = False

    @classmethod
    def from_spec(cls, spec: dict[str, float]) -> StepModel:
        return cls(
            service_s=float(spec["service_ms"]) / 1000,
            per_stream_s=float(spec["per_stream_ms"]) / 1000,
            host_s=float(spec.get("host_ms", 0.0)) / 1000,
            prefill_s=float(spec.get("prefill_ms", 0.0)) / 1000,
            prefill_per_word_s=float(spec.get("prefill_ms_per_word", 0.0)) / 1000,
            replicas=int(spec.get("replicas", 1)),
            cpu_bound=bool(spec.get("cpu_bound", False)),
        )

    def run(self, working: int, fresh: int = 0, fresh_words: int = 0) -> None:
        """Spend one step of ``working`` streams, ``fresh`` of them prefilling."""
        if working <= 0:
            return
        cost_s = self.service_s + self.per_stream_s * math.ceil(working / self.replicas)
        if fresh:
            cost_s += self.prefill_s + self.prefill_per_word_s * fresh_words
        deadline_s = time.perf_counter() + cost_s
        if self.cpu_bound:
            while time.perf_counter() < deadline_s:
                pass
        else:
            coarse_s = deadline_s - time.perf_counter() - SLEEP_MARGIN_S
            if coarse_s > 0:
                time.sleep(coarse_s)
            while time.perf_counter() < deadline_s:
                select.select([], [], [], 0)  # releases the GIL without arming a timer
        if self.host_s:
            hold_gil_for(self.host_s * min(working, self.replicas))


def hold_gil_for(cpu_s: float) -> None:
    """Run Python until this thread has had ``cpu_s`` of CPU (host work, GIL held)."""
    deadline_s = time.thread_time() + cpu_s
    while time.thread_time() < deadline_s:
        pass


class StepTrace:
    """Each step of a stage (kind, rows, start, end), written as JSON when the stage stops,
    to ``$SGLANG_OMNI_SYNTHETIC_TRACE/<stage>.json`` when that variable names a folder."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.folder = os.environ.get("SGLANG_OMNI_SYNTHETIC_TRACE")
        self.steps: list[tuple[str, int, float, float]] = []

    def step(
        self, model: StepModel, kind: str, working: int, fresh: int = 0, words: int = 0
    ) -> None:
        start = time.perf_counter()
        model.run(working, fresh, words)
        if self.folder is not None:
            self.steps.append((kind, working, start, time.perf_counter()))

    def dump(self) -> None:
        if self.folder is not None and self.steps:
            path = os.path.join(self.folder, f"{self.stage}.json")
            with open(path, "w") as out:
                json.dump(self.steps, out)


class TracedStage:
    """What the three synthetic schedulers share, mixed in before the package's base: every
    request streams (none is a one-shot compute), and the step trace is written at stop."""

    trace: StepTrace

    def is_streaming_payload(self, payload: object) -> bool:
        del payload
        return True

    def stop(self) -> None:
        super().stop()  # type: ignore[misc]
        self.trace.dump()
