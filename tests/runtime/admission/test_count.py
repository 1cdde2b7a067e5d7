"""The count of streams a stage keeps in real time, found in a few questions."""

from __future__ import annotations

import pytest

from omnitrio.admission._count import largest_holding
from omnitrio.admission._headroom import StepModel


def _first_miss(holds: object, cap: int) -> int:
    best = 0
    for n in range(1, cap + 1):
        if not holds(n):  # type: ignore[operator]
            break
        best = n
    return best


@pytest.mark.parametrize("cap", [0, 1, 2, 3, 7, 64, 100, 256])
@pytest.mark.parametrize("limit", [0, 1, 2, 5, 63, 64, 65, 99, 100, 255, 256, 300])
def test_the_largest_count_is_the_one_before_the_first_miss(cap: int, limit: int) -> None:
    asked: list[int] = []

    def holds(n: int) -> bool:
        asked.append(n)
        return n <= limit

    assert largest_holding(holds, cap) == _first_miss(lambda n: n <= limit, cap)
    assert all(1 <= n <= cap for n in asked)


def test_a_scrape_asks_a_stage_model_a_few_questions_not_one_a_stream() -> None:
    """``/metrics`` counts every stage's real-time streams up to ``max_streams``: a model
    that keeps hundreds was asked once a stream (on the trio thread) before."""
    model = StepModel(32)
    for i in range(128):
        b = 1 + i % 32
        model.observe(b, 0.008 + 0.00015 * b)
    audio_s = model.num_stream_steps * 0.1  # 100 ms of audio a stream-step: hundreds fit
    asked: list[int] = []

    def needed(stage: StepModel, n: int, audio: float) -> float:
        asked.append(n)
        return 1.05

    cap = 4096
    kept = _first_miss(lambda n: model.realtime_factor(n, audio_s) >= 1.05, cap)
    assert 200 < kept < cap
    stats = model.statistics(audio_s, cap, needed)
    assert stats.realtime_streams == kept
    assert len(asked) <= 2 * 12 + 1  # log2(4096) = 12
