"""Admission by utilisation (``admission: busy``, ``omnitrio/admission/_utilisation.py``):
the busy fraction on virtual time, the rule on it, and a real pipeline refusing once
a stage would be busy all the time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import omnitrio
from omnitrio.admission._headroom import StepModel
from omnitrio.admission._rule import Admission
from omnitrio.admission._utilisation import BUSY_HALF_LIFE_S, BusyWatch, projected_busy
from tests.conftest import chain_config
from tests.runtime.admission.test_admission import STAGES as ADMISSION_STAGES


def _watched(admission: Admission, stage: str, fraction: float, seconds: float) -> float:
    """Rounds every 10 ms for ``seconds``, the stage busy ``fraction`` of each; the
    virtual clock's end."""
    now_s = busy_s = 0.0
    model = StepModel(16)
    while now_s < seconds:
        now_s += 0.01
        busy_s += 0.01 * fraction
        admission.after_round(
            stage, model, 4, lambda *_: [], 0.0, now_s=now_s, busy_s=busy_s, num_late=4
        )
    return now_s


def test_the_busy_fraction_follows_the_stage_and_decays_while_it_is_idle() -> None:
    watch = BusyWatch(0.0, 0.0)
    busy_s = 0.0
    for tick in range(1, 1001):  # 10 s, busy 30 % of each 10 ms
        busy_s += 0.003
        watch.update(tick * 0.01, busy_s)
    assert watch.busy_fraction == pytest.approx(0.3, abs=0.01)
    # No round for one half-life: counted idle.
    assert watch.fraction_at(10.0 + BUSY_HALF_LIFE_S) == pytest.approx(0.15, abs=0.01)
    assert watch.fraction_at(9.0) == watch.busy_fraction  # never in the past
    assert projected_busy(0.3, 3) == pytest.approx(0.4)
    assert projected_busy(0.3, 0) == 0.3


def test_busy_admission_admits_while_every_stage_has_room_and_sheds_nothing() -> None:
    admission = Admission(16, 0.05, headroom=False, busy=True)
    now_s = _watched(admission, "tts", 0.28, 10.0)
    # A voice chat's TTS at four conversations: busy 28 %, a fifth stream is 35 %.
    assert admission.refusal(4, 4, [("tts", StepModel(16))], 0.0, {"tts": 4}, None, now_s) is None
    # Two stages: the second one, busy 80 % with 4 active, would be at 100 % with a fifth.
    _watched(admission, "llm", 0.8, 10.0)
    models = [("tts", StepModel(16)), ("llm", StepModel(16))]
    refusal = admission.refusal(4, 4, models, 0.0, {"tts": 4, "llm": 4}, 2.0, now_s)
    assert refusal is not None
    assert refusal.problem is not None
    assert "'llm'" in refusal.problem
    assert "busy" in refusal.problem
    # Fewer active there (the others held idle): 80 % for 8 active, 90 % with a ninth.
    assert admission.refusal(8, 8, models, 0.0, {"tts": 4, "llm": 8}, None, now_s) is None
    # The first stream is always admitted; max_streams stays the cap.
    assert admission.refusal(0, 0, models, 0.0, {"llm": 0}, None, now_s) is None
    assert admission.refusal(16, 16, [], 0.0) is not None
    # Long idle: the busy fraction decays and the stream is admitted.
    later_s = now_s + 5 * BUSY_HALF_LIFE_S
    assert admission.refusal(4, 4, models, 0.0, {"tts": 4, "llm": 4}, None, later_s) is None
    assert admission.num_shed == 0  # rounds of a stage "behind" shed nothing in busy mode


# test_admission.py's chain, b at 1 ms + 19 ms per stream in the batch for 20 ms of audio,
# its client reading at once: with one stream b is busy all the time (but for the hops).
STAGES = [ADMISSION_STAGES[0], {**ADMISSION_STAGES[1], "per_stream_ms": 19.0}]


async def refused_beside_a_playing_stream(
    stages: Sequence[dict[str, Any]], admission: str, num_items: int
) -> omnitrio.Overloaded:
    """A chain of ``stages`` admitting by ``admission``: one endless stream plays
    ``num_items`` items, then a second is asked for; its refusal (by the rule: counted
    as a headroom refusal, and nothing shed)."""
    config = chain_config(stages, max_streams=8, max_batch_size=8, client_capacity=8)
    config = config.model_copy(
        update={"pipeline": config.pipeline.model_copy(update={"admission": admission})}
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        request = omnitrio.Request("x", options={"steps": 100_000})
        async with pipeline.open_stream(request) as stream:
            received = 0
            async for _ in stream:
                received += 1
                if received == num_items:
                    break
            with pytest.raises(omnitrio.Overloaded) as refused:
                async with pipeline.open_stream(omnitrio.Request("y")):
                    pass
        stats = pipeline.statistics()
    assert stats.num_refused_headroom == stats.num_refused == 1
    assert stats.num_shed == 0
    return refused.value


async def test_a_real_pipeline_refuses_once_a_stage_would_be_busy_all_the_time() -> None:
    # >= 3 s of b's steps: its busy fraction is at least 0.875 x its utilisation
    # (half-life 1 s), a second stream would be about twice that.
    refused = await refused_beside_a_playing_stream(STAGES, "busy", 150)
    assert refused.problem is not None
    assert "'b'" in refused.problem
    assert "busy" in refused.problem
