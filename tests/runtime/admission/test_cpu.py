"""Admission by the cores the stages share (``admission: cpu``,
``omnitrio/admission/_cpu.py``): the cores a process may use, the CPU per audio second
on a virtual clock, the streams that play no audio kept apart, the rule on it, and a
real pipeline whose stage spins on a core."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio

import omnitrio
from omnitrio.admission import _cpu, _rule
from omnitrio.admission._cpu import CPU_HALF_LIFE_S, CpuWatch, plays_audio, usable_cores
from omnitrio.admission._guards import Startup
from omnitrio.admission._rule import Admission
from tests.conftest import chain_config
from tests.runtime.admission.test_utilisation import STAGES as BUSY_STAGES
from tests.runtime.admission.test_utilisation import refused_beside_a_playing_stream


def _one_spinning_core(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """One core, and a chain whose b spins 20 ms of its thread's CPU a step (``host_ms``,
    a fixed amount of work) for 20 ms of audio: a CPU second per audio second, however
    loaded the machine. The rule judges the stages by the CPU they used, so beside
    another process's load a spin of 20 ms of wall time (``cpu_bound``) got less of the
    core and looked cheap, and the streams these tests expect refused were admitted.
    The rule's weights are kept for the whole test (a long half-life): a loaded machine
    stretches the test's wall time, and the audio heard would otherwise weigh less than
    the rule needs for an opinion (it then admits)."""
    monkeypatch.setattr(_rule, "usable_cores", lambda: 1.0)
    monkeypatch.setattr(_cpu, "CPU_HALF_LIFE_S", 600.0)
    return [BUSY_STAGES[0], {**BUSY_STAGES[1], "per_stream_ms": 0.0, "host_ms": 20.0}]


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
    # b spins 20 ms of CPU a step for 20 ms of audio: a second of audio costs about a CPU
    # second. On one core a second stream would get about half real time.
    stages = _one_spinning_core(monkeypatch)
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
    # The guard keeps a playing stream up to twice the usual answer's audio (4 s here):
    # one far longer (row 4's "W." x 100, made at about real time) would hold it forever.
    assert admission.startup.guards(8.0)
    assert not admission.startup.guards(8.1)
    assert Startup().guards(1000.0)  # no answer yet: every playing stream
    # A stream that completed without audio leaves the startup as it was.
    admission.completed(1.0)
    assert admission.refusal(1, 1, [], 0.0, least_slack_s=lambda: 0.5) is not None


def test_a_request_plays_audio_unless_its_modalities_or_task_say_it_does_not() -> None:
    assert plays_audio(omnitrio.Request("hi"))  # unset modalities hold everything
    assert plays_audio(omnitrio.Request("hi", options={"modalities": "text,audio"}))
    assert not plays_audio(omnitrio.Request("hi", options={"modalities": "text"}))
    assert not plays_audio(omnitrio.Request(options={"task": "transcribe"}))
    assert plays_audio(omnitrio.Request("hi", options={"task": "speak"}))


def _quiet_load(
    watch: CpuWatch, cores_used: float, num_quiet: int, seconds: float, start_s: float
) -> float:
    """Samples every 0.1 s for ``seconds``: ``num_quiet`` live streams that play no audio
    use ``cores_used`` of the cores, no audio is delivered; the virtual clock's end."""
    now_s, cpu_s, audio_s = start_s, watch.cpu_s, watch.audio_s
    while now_s < start_s + seconds:
        now_s += 0.1
        cpu_s += 0.1 * cores_used
        watch.update(now_s, cpu_s, audio_s, num_audio=0, num_quiet=num_quiet)
    return now_s


def test_streams_that_play_no_audio_are_charged_their_own_cores_not_the_audio_seconds() -> None:
    # Row 7 of docs/reliability.md: answers played earlier, then four long transcriptions
    # take 1.8 of the 2 cores and deliver no audio. Charged to the audio seconds, the cost
    # of one climbed past what any stream could have: every stream was refused.
    admission = Admission(16, 0.05, headroom=False, cpu=True)
    watch = admission.cpu
    assert watch is not None
    watch.cores = 2.0
    now_s = _fed(watch, 0.75, 10.0)
    _quiet_load(watch, 1.8, 4, 4.0, now_s)
    assert watch.cpu_s_per_audio_s == pytest.approx(0.75, rel=0.01)  # audio's cost kept
    assert watch.quiet_cores == pytest.approx(0.45, rel=0.01)  # a transcription's cores
    # Another transcription beside them: nothing playing, nothing to keep: admitted.
    assert admission.refusal(4, 4, [], 0.0, num_quiet=4, plays_audio=False) is None
    # One that plays audio: they take 1.6 of the cores (their equal share, under 4 x 0.45),
    # 0.4 left at 0.75 CPU s per audio s is 0.53x real time: refused, by the cores.
    refusal = admission.refusal(4, 4, [], 0.0, num_quiet=4)
    assert refusal is not None
    assert refusal.problem is not None
    assert "1 streams playing audio beside 4 playing none" in refusal.problem
    # A transcription beside one answer playing and one transcription: 0.9 of the cores
    # to the two, 1.1 left for the answer at 1.47x: admitted; beside four, 1.67 to the
    # five, the answer at 0.44x: refused.
    assert admission.refusal(2, 2, [], 0.0, num_quiet=1, plays_audio=False) is None
    refusal = admission.refusal(5, 5, [], 0.0, num_quiet=4, plays_audio=False)
    assert refusal is not None
    assert refusal.problem is not None
    assert "beside 5 playing none" in refusal.problem
    # Before any is measured, a quiet stream is counted at its equal share of the cores.
    fresh = CpuWatch(cores=2.0)
    _fed(fresh, 0.5, 10.0)
    assert fresh.quiet_cores is None
    assert fresh.quiet_take(1, 1) == pytest.approx(1.0)
    assert fresh.realtime_factor(1, 1) == pytest.approx(1.0 / 0.5)


async def test_a_real_pipeline_admits_streams_that_play_no_audio_beside_a_spinning_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One core; b spins 20 ms of CPU a step for 20 ms of audio (a CPU second per audio
    # second). A stream plays 2 s, then two streams that play no audio (text instead of
    # b's audio, as a transcription) spin the core: the second of them is admitted (the
    # old rule charged their CPU to the audio seconds and refused it), and one that
    # plays audio beside them is refused by the cores.
    stages = _one_spinning_core(monkeypatch)
    config = chain_config(stages, max_streams=8, max_batch_size=8, client_capacity=8)
    config = config.model_copy(
        update={"pipeline": config.pipeline.model_copy(update={"admission": "cpu"})}
    )
    quiet = omnitrio.Request(
        "q", options={"modalities": "text", "steps": 100_000, "b.visible": "text"}
    )

    async def take(stream: omnitrio.Stream, count: int) -> list[object]:
        items = []
        async for item in stream:
            items.append(item)
            if len(items) == count:
                break
        return items

    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream(omnitrio.Request("x", options={"steps": 100_000})) as s:
            assert all(isinstance(i, omnitrio.AudioChunk) for i in await take(s, 100))
        async with pipeline.open_stream(quiet) as first:
            texts = await take(first, 50)  # ~1 s of the core
            assert all(isinstance(i, omnitrio.TextDelta) for i in texts)
            async with pipeline.open_stream(quiet) as second:
                assert len(await take(second, 25)) == 25
                with pytest.raises(omnitrio.Overloaded) as refused:
                    async with pipeline.open_stream(omnitrio.Request("y")):
                        pass
        stats = pipeline.statistics()
    assert refused.value.problem is not None
    assert "playing none" in refused.value.problem
    assert stats.num_refused == 1
    assert stats.num_shed == 0


async def test_requests_that_arrive_together_are_admitted_while_the_cores_have_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Row 4's three clients asking for speech at once. The startup guard counted a
    # stream on its way to its first audio at the slack its first chunk would give it
    # (here 20 ms less the 0.25 s buffer: -0.23 s, less than any startup), so the
    # second and third of a burst were refused; only streams that play count now.
    monkeypatch.setattr(_rule, "usable_cores", lambda: 64.0)
    config = chain_config(BUSY_STAGES, max_streams=8, max_batch_size=8, client_capacity=8)
    config = config.model_copy(
        update={"pipeline": config.pipeline.model_copy(update={"admission": "cpu"})}
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        for _ in range(2):  # two complete: the startup guard has a mean startup
            async with pipeline.open_stream(omnitrio.Request("x", options={"steps": 60})) as s:
                async for _ in s:
                    pass
        assert pipeline._admission.startup.mean_s is not None
        received: list[int] = []

        async def one() -> None:
            async with pipeline.open_stream(omnitrio.Request("y", options={"steps": 10})) as s:
                received.append(len([item async for item in s]))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
        stats = pipeline.statistics()
    assert received == [10, 10, 10]
    assert stats.num_refused == 0
