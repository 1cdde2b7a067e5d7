"""The side stage's input gate (omnitrio/server/_side_stage.py): a side stage class's
``input_gate`` holds the appended chunks that change nothing it reports and hands them
over, joined, with the next one it lets through."""

from __future__ import annotations

from collections.abc import Mapping

import trio

import omnitrio
from omnitrio.server._side_stage import SessionSideStream, SideStage
from tests.conftest import chain_config
from tests.runtime.test_side_stage import Echo


class EveryThird:
    """Lets every ``every``-th chunk through (with the ones held before it)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.num_taken = 0
        self.samples: list[int] = []

    def take(self, num_samples: int) -> bool:
        self.num_taken += 1
        self.samples.append(num_samples)
        return self.num_taken % self.every == 0


class GatedEcho(Echo):
    """``Echo`` (one event per input: its index and length) with an input gate."""

    def __init__(self, name: str, device: str = "cpu", every: int = 3) -> None:
        super().__init__(name, device)

    @classmethod
    def input_gate(cls, params: Mapping[str, object]) -> EveryThird | None:
        every = params.get("every", 3)
        assert isinstance(every, int)
        return EveryThird(every) if every > 1 else None


def _config(impl: str, params: dict[str, object]) -> omnitrio.PipelineConfig:
    base = chain_config([{"steps": 1}])
    side = omnitrio.StageSpec(name="echo", impl=impl, params=params)
    return base.model_copy(update={"side_stage": side})


async def _events(detector: SessionSideStream, count: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    with trio.fail_after(10):
        async for event in detector:
            got.append((int(event.data["n"]), int(event.data["len"])))  # type: ignore[arg-type]
            if len(got) == count:
                break
    return got


async def test_the_gate_holds_chunks_and_hands_them_over_joined_in_order() -> None:
    config = _config("tests.server.test_side_stage_gate:GatedEcho", {"every": 3})
    async with omnitrio.open_pipeline(config) as pipeline:
        side_stage = SideStage.of(pipeline)
        assert side_stage is not None
        detector = side_stage.open(0, {})
        sizes = [2, 4, 6, 8, 10, 12, 14]
        for size in sizes:
            detector.append(bytes(size))
        # Chunks 1-3 as one input, 4-6 as another; the 7th is held.
        assert await _events(detector, 2) == [(1, 2 + 4 + 6), (2, 8 + 10 + 12)]
        gate = detector._gate
        assert isinstance(gate, EveryThird)
        assert gate.samples == [size // 2 for size in sizes]  # PCM16 samples per chunk
        detector.append(bytes(16))
        detector.append(bytes(18))
        assert await _events(detector, 1) == [(3, 14 + 16 + 18)]
        detector.close()


async def test_each_detector_gets_its_own_gate() -> None:
    config = _config("tests.server.test_side_stage_gate:GatedEcho", {"every": 2})
    async with omnitrio.open_pipeline(config) as pipeline:
        side_stage = SideStage.of(pipeline)
        assert side_stage is not None
        first, second = side_stage.open(0, {}), side_stage.open(0, {})
        assert first._gate is not second._gate
        first.append(bytes(2))
        second.append(bytes(4))
        second.append(bytes(6))
        assert await _events(second, 1) == [(1, 10)]
        first.append(bytes(8))
        assert await _events(first, 1) == [(1, 10)]
        first.close()
        second.close()


async def test_without_a_gate_every_chunk_goes_to_the_stage_at_once() -> None:
    for impl, params in (
        ("tests.runtime.test_side_stage:Echo", {}),  # no input_gate
        ("tests.server.test_side_stage_gate:GatedEcho", {"every": 1}),  # input_gate: None
    ):
        async with omnitrio.open_pipeline(_config(impl, params)) as pipeline:
            side_stage = SideStage.of(pipeline)
            assert side_stage is not None
            detector = side_stage.open(0, {})
            assert detector._gate is None
            detector.append(bytes(2))
            detector.append(bytes(4))
            assert await _events(detector, 2) == [(1, 2), (2, 4)]
            detector.close()
