"""Admission by the CPU the pipeline's process uses (``admission: cpu``).

Each stage's step-time model (``_headroom.py``) and busy fraction (``_utilisation.py``)
is its own; where the stages run on a few shared cores (a voice chat: speech
recognition, a language model's decoders and a TTS, each with threads of its own, on
two cores) none of them sees the others take the cores: a stage's step grows when
another stage runs beside it, and a stage that waits on its own worker threads reads
busy while it takes no core at all. The cores are the shared stage. ``CpuWatch``
learns what a second of answer audio costs them: the process's CPU time (every
thread's, and the child processes it waited for) over the audio the pipeline
delivered, both weighted by age (half-life ``CPU_HALF_LIFE_S``), ``c`` CPU seconds per
audio second. ``n`` streams that each play in real time need ``n x c`` of the
``cores`` the process may use (its CPU affinity, within a cgroup's CPU quota), so the
cores keep them at ``cores / (n x c)`` times real time: the same realtime factor the
stage models give, for the stage they share, and a stream is refused while, with it,
that factor is below what admission asks (``Admission.needed``). ``c`` counts all the
work an answer brings (its recognition, its prompt, the turn detector beside it), not
only the audio steps, so the rule is cautious where some of that work is not per
answer; it sheds nothing (a late answer is a pause, a shed one no answer).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

CPU_HALF_LIFE_S = 4.0
"""Half-life of the past in the CPU and audio sums (a few answers)."""
MIN_CPU_AUDIO_S = 1.0
"""Audio (weighted) delivered before the watch has an opinion."""
MIN_SAMPLE_S = 0.05
"""The shortest interval between two samples of the process's CPU time."""
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> float:
    """The cores this process may use: its CPU affinity, within the cgroup's (v2)
    ``cpu.max`` quota where one is set."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = float(os.cpu_count() or 1)
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max" or float(period) <= 0:
        return cores
    return max(0.01, min(cores, float(quota) / float(period)))


def process_cpu_s() -> float:
    """CPU seconds this process has used (every thread), with its waited-for children's."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


@dataclass(slots=True)
class CpuWatch:
    """The process's CPU time against the audio it delivered, weighted by age."""

    cores: float
    at_s: float | None = None
    cpu_s: float = 0.0
    """The process's CPU time at ``at_s``."""
    audio_s: float = 0.0
    """Audio delivered by ``at_s``."""
    weighted_cpu_s: float = 0.0
    weighted_audio_s: float = 0.0

    def update(self, now_s: float, cpu_s: float, audio_s: float) -> None:
        """By ``now_s`` the process had used ``cpu_s`` and delivered ``audio_s`` in all."""
        if self.at_s is None:
            self.at_s, self.cpu_s, self.audio_s = now_s, cpu_s, audio_s
            return
        elapsed_s = now_s - self.at_s
        if elapsed_s < MIN_SAMPLE_S:
            return
        keep = 0.5 ** (elapsed_s / CPU_HALF_LIFE_S)
        self.weighted_cpu_s = self.weighted_cpu_s * keep + max(0.0, cpu_s - self.cpu_s)
        self.weighted_audio_s = self.weighted_audio_s * keep + max(0.0, audio_s - self.audio_s)
        self.at_s, self.cpu_s, self.audio_s = now_s, cpu_s, audio_s

    @property
    def cpu_s_per_audio_s(self) -> float | None:
        """``c``: CPU seconds per second of audio lately (None: too little audio yet)."""
        if self.weighted_audio_s < MIN_CPU_AUDIO_S:
            return None
        return self.weighted_cpu_s / self.weighted_audio_s

    def realtime_factor(self, num_streams: int) -> float:
        """Audio seconds each of ``num_streams`` streams gets per second of the cores
        (inf: no opinion yet)."""
        cost = self.cpu_s_per_audio_s
        if cost is None or cost <= 0 or num_streams <= 0:
            return math.inf
        return self.cores / (num_streams * cost)

    def problem(self, num_live: int, needed: float) -> str | None:
        """Why one more stream is refused beside ``num_live`` (None: it is not)."""
        factor = self.realtime_factor(num_live + 1)
        if factor >= needed:
            return None
        cost = self.cpu_s_per_audio_s
        return (
            f"with {num_live + 1} streams the {self.cores:g} cores would make {factor:.2f} s "
            f"of audio per second for each at {cost:.2f} CPU s per audio s "
            f"(pipeline.realtime_margin asks for {needed:.2f})"
        )
