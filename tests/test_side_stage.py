"""The side stage (a config's turn_detection): the same actor machinery, fed by its caller."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
import trio

import omnitrio
from omnitrio import Event, Request, StreamOutput, StreamWork
from tests.conftest import chain_config


class Echo:
    """One event per input chunk: its index and length."""

    max_inputs_per_step: int | None = 1
    max_payloads_per_step = 0
    max_visible_per_step = 1

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.seen: dict[str, int] = {}

    def open_stream(self, stream_id: str, request: Request) -> None:
        self.seen[stream_id] = 0

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        outputs = {}
        for work in batch:
            visible = []
            for chunk in work.inputs:
                assert isinstance(chunk, bytes)
                self.seen[work.stream_id] += 1
                visible.append(Event("chunk", {"n": self.seen[work.stream_id], "len": len(chunk)}))
            outputs[work.stream_id] = StreamOutput(visible=tuple(visible))
        return outputs

    def close_stream(self, stream_id: str) -> None:
        del self.seen[stream_id]

    def close(self) -> None:
        self.seen.clear()


def _config() -> omnitrio.PipelineConfig:
    base = chain_config([{"steps": 1}, {"outputs_per_input": 0}])
    return base.model_copy(
        update={
            "turn_detection": omnitrio.StageSpec(name="echo", impl="tests.test_side_stage:Echo")
        }
    )


async def test_a_side_stream_gets_every_event_even_when_its_reader_lags() -> None:
    async with omnitrio.open_pipeline(_config()) as pipeline:
        side = pipeline.open_side_stream(Request())
        for index in range(40):  # far more events than the client link holds (16)
            assert side.append(bytes(index + 1))
        await trio.sleep(0.3)  # the stage runs ahead of the reader and is held back
        got = []
        with trio.fail_after(10):
            async for event in side.stream:
                got.append(event.data["n"])
                if len(got) == 40:
                    break
        assert got == list(range(1, 41))  # nothing dropped, in order
        stats = pipeline.statistics().side_stage
        assert stats is not None
        assert stats.name == "echo"
        assert stats.num_skipped_no_credit > 0  # it waited for the reader instead
        assert pipeline.statistics().num_open_streams == 0  # not a response
        side.close()
        await side.stream.aclose()  # released by the stage
        assert pipeline.statistics().side_stage.num_open_streams == 0  # type: ignore[union-attr]
        assert side.append(b"late") is False  # ignored once closed


async def test_a_pipeline_without_a_side_stage_says_so() -> None:
    async with omnitrio.open_pipeline(chain_config([{"steps": 1}])) as pipeline:
        assert pipeline.side_stage is None
        with pytest.raises(LookupError, match="no side stage"):
            pipeline.open_side_stream(Request())
