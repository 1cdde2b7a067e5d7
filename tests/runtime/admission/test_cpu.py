"""Admission by the cores the stages share (``admission: cpu``,
``omnitrio/admission/_cpu.py``): the cores a process may use, the CPU per audio second
on a virtual clock, the rule on it, and a real pipeline whose stage spins on a core."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from omnitrio.admission import _rule
from omnitrio.admission._cpu import CPU_HALF_LIFE_S, CpuWatch, usable_cores
from omnitrio.admission._rule import Admission
from tests.runtime.admission.test_utilisation import STAGES as BUSY_STAGES
from tests.runtime.admission.test_utilisation import refused_beside_a_playing_stream


def test_the_usable_cores_are_the_affinity_within_a_cgroup_quota(tmp_path: Path) -> None:
    affinity = usable_cores(tmp_path / "absent")
    assert affinity >= 1
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("50000 100000\n")
    assert usable_cores(cpu_max) == 0.5
    cpu_max.write_text("max 100000\n")
    assert usable_cores(cpu_max) == affinity
    cpu_max.write_text("garbage\n")
    assert usable_cores(cpu_max) == affinity


def _fed(watch: CpuWatch, cpu_per_audio: float, seconds: float, start_s: float = 0.0) -> float:
    """Samples every 0.1 s for ``seconds``: 0.1 s of audio and ``cpu_per_audio`` times
    that of CPU each; the virtual clock's end."""
    now_s, cpu_s, audio_s = start_s, watch.cpu_s, watch.audio_s
    watch.update(now_s, cpu_s, audio_s)
    while now_s < start_s + seconds:
        now_s += 0.1
        cpu_s += 0.1 * cpu_per_audio
        audio_s += 0.1
        watch.update(now_s, cpu_s, audio_s)
    return now_s


def test_the_watch_learns_the_cpu_a_second_of_audio_costs_and_follows_a_change() -> None:
    watch = CpuWatch(cores=2.0)
    assert watch.realtime_factor(4) == math.inf  # nothing delivered: no opinion
    watch.update(0.0, 0.0, 0.0)
    watch.update(0.5, 0.4, 0.5)  # half a second of audio: still none
    assert watch.cpu_s_per_audio_s is None
    now_s = _fed(watch, 0.75, 10.0, 0.5)
    assert watch.cpu_s_per_audio_s == pytest.approx(0.75, rel=0.01)
    # Two cores at 0.75 CPU s per audio s: two streams at 1.33x, three at 0.89x.
    assert watch.realtime_factor(2) == pytest.approx(2 / 1.5, rel=0.01)
    assert watch.problem(1, 1.05) is None
    problem = watch.problem(2, 1.05)
    assert problem is not None
    assert "3 streams" in problem
    assert "0.75 CPU s per audio s" in problem
    # The audio gets dearer (a neighbour takes the cores' time): within a few half-lives.
    _fed(watch, 1.5, 4 * CPU_HALF_LIFE_S, now_s)
    assert watch.cpu_s_per_audio_s == pytest.approx(1.5, rel=0.1)
    assert watch.problem(1, 1.05) is not None


def test_samples_closer_than_the_shortest_interval_are_folded_into_the_next() -> None:
    watch = CpuWatch(cores=1.0)
    watch.update(0.0, 0.0, 0.0)
    watch.update(0.01, 5.0, 5.0)  # too soon: not counted yet ...
    assert watch.weighted_audio_s == 0.0
    watch.update(0.2, 5.0, 5.0)  # ... but not lost
    assert watch.weighted_audio_s == pytest.approx(5.0)
    assert watch.cpu_s_per_audio_s == pytest.approx(1.0)


def test_cpu_admission_refuses_only_by_the_cores_and_sheds_nothing() -> None:
    admission = Admission(16, 0.05, headroom=False, cpu=True)
    assert admission.cpu is not None
    assert admission.refusal(3, 3, [], 0.0) is None  # no audio yet: no opinion
    admission.cpu.cores = 2.0
    _fed(admission.cpu, 0.75, 10.0)
    assert admission.refusal(0, 0, [], 0.0, now_s=10.0) is None  # the first stream: always
    assert admission.refusal(1, 1, [], 0.0, now_s=10.0) is None
    refusal = admission.refusal(2, 2, [], 0.0, oldest_age_s=1.0, now_s=10.0)
    assert refusal is not None
    assert refusal.problem is not None
    assert "cores" in refusal.problem
    assert admission.refusal(16, 16, [], 0.0, now_s=10.0) is not None  # max_streams: the cap
    assert not admission.busy
    assert not admission.headroom


async def test_a_real_pipeline_refuses_a_second_stream_while_its_stage_spins_a_whole_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # b spins (cpu_bound) 20 ms a step for 20 ms of audio: a second of audio costs about
    # a CPU second. On one core a second stream would get about half real time.
    monkeypatch.setattr(_rule, "usable_cores", lambda: 1.0)
    stages = [BUSY_STAGES[0], {**BUSY_STAGES[1], "cpu_bound": True}]
    refused = await refused_beside_a_playing_stream(stages, "cpu", 100)  # 2 s of audio
    assert refused.problem is not None
    assert "1 cores" in refused.problem


def test_while_a_live_stream_has_less_slack_than_a_startup_nothing_is_admitted() -> None:
    admission = Admission(16, 0.05, headroom=False, cpu=True)
    assert admission.cpu is not None
    admission.cpu.cores = 8.0
    _fed(admission.cpu, 0.25, 10.0)  # the cores keep many streams
    # No stream has had its first audio yet: no startup known, no guard.
    assert admission.refusal(1, 1, [], 0.0, least_slack_s=lambda: 0.1) is None
    assert admission.startup.starting_slack_s(admission.client_buffer_s) is None
    admission.completed(5.0, 4.0, 0.4, startup_s=0.6)
    refusal = admission.refusal(1, 1, [], 0.0, least_slack_s=lambda: 0.3)
    assert refusal is not None
    assert refusal.problem is not None
    assert "0.30 s from its playback deadline" in refusal.problem
    assert "0.60 s to its first audio" in refusal.problem
    # Sooner than a slot frees (5 s, one completed in 5 s): once that stream, making
    # audio at twice real time, is a startup from its deadline.
    assert refusal.retry_after_s == pytest.approx(0.3)
    assert admission.refusal(1, 1, [], 0.0, least_slack_s=lambda: 0.7) is None
    # A stream on its way to its first audio will have its first chunk ahead when that
    # comes, less the client's buffer (the pipeline counts that as its slack).
    assert admission.startup.starting_slack_s(0.25) == pytest.approx(0.4 - 0.25)
    # A stream that completed without audio leaves the startup as it was.
    admission.completed(1.0)
    assert admission.refusal(1, 1, [], 0.0, least_slack_s=lambda: 0.5) is not None
