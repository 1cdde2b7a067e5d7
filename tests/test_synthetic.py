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
