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

A stream whose request asks for no audio (``plays_audio``: a transcription, a text
chat) has no playback to keep and delivers no audio: charging its CPU to the audio
streams' seconds made ``c`` climb without bound beside one, and every stream was
refused (1,304 of 1,320 short transcriptions beside four long ones). So each sample's
CPU is shared among the live streams, an equal part each, and the *quiet* streams'
parts are kept apart: ``q`` the cores one quiet stream takes while it is live. The
audio streams keep ``cores - T``, ``T`` the quiet streams' take (``n_q x q``, at most
their equal share of the cores: the cores are shared, not given to whoever asks most),
so ``n_a`` audio streams run at ``(cores - T) / (n_a x c)`` times real time. A new
audio stream is refused while, with it, that is below ``needed``; a new quiet one only
while, with it, the audio streams live would fall below ``needed`` (with none live, a
quiet stream is always admitted: nothing would be late).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .._items import Request

CPU_HALF_LIFE_S = 4.0
"""Half-life of the past in the CPU and audio sums (a few answers)."""
MIN_CPU_AUDIO_S = 1.0
"""Audio (weighted) delivered before the watch has an opinion."""
MIN_SAMPLE_S = 0.05
"""The shortest interval between two samples of the process's CPU time."""
MIN_QUIET_STREAM_S = 0.5
"""Quiet stream-seconds (weighted) before the watch has their cores per stream."""
QUIET_TASKS = frozenset({"transcribe"})
"""Request tasks (``ResponseOptions.task``) whose answer holds no audio whatever its
modalities say."""
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


def plays_audio(request: Request) -> bool:
    """Whether the stream answering ``request`` plays audio: its modalities hold audio
    and its task is not one of ``QUIET_TASKS``."""
    options = request.options
    return options.wants("audio") and options.task not in QUIET_TASKS


@dataclass(slots=True)
class CpuWatch:
    """The process's CPU time against the audio it delivered, weighted by age; the
    share of the live streams that play no audio kept apart (the module's rule)."""

    cores: float
    at_s: float | None = None
    cpu_s: float = 0.0
    """The process's CPU time at ``at_s``."""
    audio_s: float = 0.0
    """Audio delivered by ``at_s``."""
    weighted_cpu_s: float = 0.0
    """CPU charged to the streams that play audio (all of it while none is live)."""
    weighted_audio_s: float = 0.0
    weighted_quiet_cpu_s: float = 0.0
    """CPU charged to the live streams that play no audio."""
    weighted_quiet_stream_s: float = 0.0
    """Their stream-seconds (a stream live for a second counts one)."""

    def update(
        self, now_s: float, cpu_s: float, audio_s: float, num_audio: int = 0, num_quiet: int = 0
    ) -> None:
        """By ``now_s`` the process had used ``cpu_s`` and delivered ``audio_s`` in all;
        ``num_audio`` streams that play audio and ``num_quiet`` that play none are live."""
        if self.at_s is None:
            self.at_s, self.cpu_s, self.audio_s = now_s, cpu_s, audio_s
            return
        elapsed_s = now_s - self.at_s
        if elapsed_s < MIN_SAMPLE_S:
            return
        keep = 0.5 ** (elapsed_s / CPU_HALF_LIFE_S)
        used_s = max(0.0, cpu_s - self.cpu_s)
        num_live = num_audio + num_quiet
        quiet_s = used_s * num_quiet / num_live if num_live else 0.0
        self.weighted_cpu_s = self.weighted_cpu_s * keep + used_s - quiet_s
        self.weighted_audio_s = self.weighted_audio_s * keep + max(0.0, audio_s - self.audio_s)
        self.weighted_quiet_cpu_s = self.weighted_quiet_cpu_s * keep + quiet_s
        self.weighted_quiet_stream_s = self.weighted_quiet_stream_s * keep + num_quiet * elapsed_s
        self.at_s, self.cpu_s, self.audio_s = now_s, cpu_s, audio_s

    @property
    def cpu_s_per_audio_s(self) -> float | None:
        """``c``: CPU seconds per second of audio lately (None: too little audio yet)."""
        if self.weighted_audio_s < MIN_CPU_AUDIO_S:
            return None
        return self.weighted_cpu_s / self.weighted_audio_s

    @property
    def quiet_cores(self) -> float | None:
        """``q``: the cores one live stream that plays no audio took lately (None: too
        few such streams yet)."""
        if self.weighted_quiet_stream_s < MIN_QUIET_STREAM_S:
            return None
        return self.weighted_quiet_cpu_s / self.weighted_quiet_stream_s

    def quiet_take(self, num_audio: int, num_quiet: int) -> float:
        """``T``: the cores ``num_quiet`` quiet streams take beside ``num_audio`` audio
        ones, ``num_quiet x q``, at most their equal share (all of it where ``q`` is
        not known yet)."""
        if num_quiet <= 0:
            return 0.0
        share = self.cores * num_quiet / (num_audio + num_quiet)
        cores = self.quiet_cores
        return share if cores is None else min(share, num_quiet * cores)

    def realtime_factor(self, num_streams: int, num_quiet: int = 0) -> float:
        """Audio seconds each of ``num_streams`` audio streams gets per second of the
        cores beside ``num_quiet`` quiet ones (inf: no opinion yet)."""
        cost = self.cpu_s_per_audio_s
        if cost is None or cost <= 0 or num_streams <= 0:
            return math.inf
        left = self.cores - self.quiet_take(num_streams, num_quiet)
        return left / (num_streams * cost)

    def problem(
        self, num_audio: int, needed: float, num_quiet: int = 0, audio: bool = True
    ) -> str | None:
        """Why one more stream (one that plays audio if ``audio``) is refused beside
        ``num_audio`` live streams that play audio and ``num_quiet`` that play none
        (None: it is not)."""
        streams, quiet = (num_audio + 1, num_quiet) if audio else (num_audio, num_quiet + 1)
        factor = self.realtime_factor(streams, quiet)
        if factor >= needed:
            return None
        cost = self.cpu_s_per_audio_s
        beside = "" if not quiet else f" beside {quiet} playing none"
        return (
            f"with {streams} streams playing audio{beside} the {self.cores:g} cores would make "
            f"{factor:.2f} s of audio per second for each at {cost:.2f} CPU s per audio s "
            f"(pipeline.realtime_margin asks for {needed:.2f})"
        )
