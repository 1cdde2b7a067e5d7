"""The synthetic stage's step costs what its profile says (never less), with its own work inside."""

from __future__ import annotations

import time

import pytest

from omnitrio import Request, StreamWork
from stages.synthetic import SyntheticPayload, SyntheticStage


@pytest.mark.parametrize("cpu_bound", [False, True])
def test_a_step_returns_at_its_profiles_deadline_and_counts_how_late(cpu_bound: bool) -> None:
    stage = SyntheticStage(
        "thinker",
        steps=3,
        payload_bytes=64,
        service_time_ms=4.0,
        per_stream_ms=0.5,
        prefill_ms=3.0,
        prefill_ms_per_word=0.25,
        cpu_bound=cpu_bound,
    )
    for name in ("a", "b"):
        stage.open_stream(name, Request("four words of text"))
    batch = [StreamWork(name, (), True) for name in ("a", "b")]
    # First step: 4 ms + 2 x 0.5 ms per stream + 3 ms prefill + 8 words x 0.25 ms.
    # Then two steps without prefill: 5 ms each.
    costs_s = [0.010, 0.005, 0.005]
    overruns_s = []
    for cost_s in costs_s:
        started_s = time.perf_counter()
        outputs = stage.step(batch)
        ended_s = time.perf_counter()
        assert ended_s - started_s >= cost_s
        overruns_s.append(ended_s - started_s - cost_s)
        for output in outputs.values():
            (payload,) = output.payloads
            assert isinstance(payload, SyntheticPayload)
            # Stamped when the step is due to end: its own work is inside its budget.
            assert started_s + cost_s <= payload.produced_s <= ended_s
    # The stage's own count of how late its steps ended: at most what the caller saw.
    assert 0 <= stage.late_max_s <= max(overruns_s)
    assert 0 <= stage.late_total_s <= sum(overruns_s)


def test_a_step_without_service_time_costs_only_its_own_work() -> None:
    stage = SyntheticStage("s", steps=1, service_time_ms=0.0)
    stage.open_stream("a", Request("hi"))
    started_s = time.perf_counter()
    (output,) = stage.step([StreamWork("a", (), True)]).values()
    assert output.done
    assert stage.late_total_s == stage.late_max_s <= time.perf_counter() - started_s


def test_a_talker_makes_its_frames_per_input_one_per_step_carrying_fractions() -> None:
    stage = SyntheticStage("talker", frames_per_input=3.5)
    stage.open_stream("a", Request("hi"))
    made, steps = 0, 0
    inputs: tuple[object, ...] = ("t1",)
    more = True
    while more or inputs:
        (output,) = stage.step([StreamWork("a", inputs, False)]).values()
        made += len(output.payloads)
        steps += 1
        more = output.more
        # a second token arrives once the first one's frames are made
        inputs = ("t2",) if not more and steps < 5 else ()
    # 3.5 frames per token: 3 for the first token, then 4 (the half carried over).
    assert (made, steps) == (7, 7)
    (last,) = stage.step([StreamWork("a", (), True)]).values()
    assert last.done
    assert not last.payloads


def test_code2wav_makes_a_unit_per_whole_window_and_charges_only_those_streams() -> None:
    stage = SyntheticStage(
        "code2wav",
        inputs_per_step=25,
        window=25,
        outputs_per_input=0,
        visible="audio",
        audio_samples=480,
        sample_rate_hz=24000,
        service_time_ms=50.0,
    )
    for name in ("a", "b"):
        stage.open_stream(name, Request("hi"))
    started_s = time.perf_counter()
    outputs = stage.step([StreamWork("a", ("f",) * 24, False), StreamWork("b", ("f",) * 3, False)])
    # No stream has a whole window yet: nothing made and no service time charged.
    assert time.perf_counter() - started_s < 0.050
    assert all(not out.visible and not out.more and not out.done for out in outputs.values())
    outputs = stage.step([StreamWork("a", ("f",) * 2, False)])
    assert time.perf_counter() - started_s >= 0.050
    assert len(outputs["a"].visible) == 1
    # The input closes with 1 frame held: the rest makes a last window.
    (out,) = stage.step([StreamWork("a", (), True)]).values()
    assert len(out.visible) == 1
    assert out.done


def test_host_time_is_cpu_time_of_the_calling_thread_after_the_device_time() -> None:
    stage = SyntheticStage("thinker", steps=2, service_time_ms=2.0, host_ms=5.0)
    stage.open_stream("a", Request("hi"))
    cpu_s = time.thread_time()
    started_s = time.perf_counter()
    stage.step([StreamWork("a", (), True)])
    assert time.thread_time() - cpu_s >= 0.005  # held by this thread: Python, GIL held
    assert time.perf_counter() - started_s >= 0.007


def test_replicas_split_the_batch_and_pay_host_time_once_each() -> None:
    stage = SyntheticStage("talker", steps=1, per_stream_ms=10.0, replicas=2, host_ms=3.0)
    for name in ("a", "b"):
        stage.open_stream(name, Request("hi"))
    cpu_s = time.thread_time()
    started_s = time.perf_counter()
    stage.step([StreamWork(name, (), True) for name in ("a", "b")])
    # Two streams on two devices in parallel: 10 ms of device time, 2 x 3 ms of host.
    assert time.perf_counter() - started_s >= 0.016
    assert time.thread_time() - cpu_s >= 0.006


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"steps": 4, "frames_per_input": 2.0}, "input mode"),
        ({"frames_per_input": 2.0, "window": 4}, "not both"),
        ({"frames_per_input": 0.0}, "above 0"),
        ({"replicas": 0}, "replicas"),
        ({"host_ms": -1.0}, "host_ms"),
    ],
)
def test_bad_shape_params_are_refused_by_name(params: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SyntheticStage("s", **params)  # type: ignore[arg-type]
