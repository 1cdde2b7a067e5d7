"""The side stage (a config's side_stage): the same actor machinery, fed by its caller."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import ClassVar

import pytest
import trio
import trio.testing

import omnitrio
from omnitrio import Event, Request, StreamOutput, StreamWork
from tests.conftest import chain_config


class Echo:
    """One event per input chunk: its index and length. ``num_steps_started`` counts
    the steps begun, across instances, for a test to wait on (``wait_for_steps``)."""

    max_inputs_per_step: int | None = 1
    max_payloads_per_step = 0
    max_visible_per_step = 1
    num_steps_started: ClassVar[int] = 0
    _stepped: ClassVar[threading.Condition] = threading.Condition()

    @classmethod
    def wait_for_steps(cls, count: int, timeout_s: float) -> bool:
        """Block the calling thread until ``count`` steps have begun (False on timeout)."""
        with cls._stepped:
            return cls._stepped.wait_for(lambda: cls.num_steps_started >= count, timeout_s)

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.seen: dict[str, int] = {}

    def open_stream(self, stream_id: str, request: Request) -> None:
        self.seen[stream_id] = 0

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        with Echo._stepped:
            Echo.num_steps_started += 1
            Echo._stepped.notify_all()
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
            "side_stage": omnitrio.StageSpec(name="echo", impl="tests.runtime.test_side_stage:Echo")
        }
    )


async def test_a_side_stream_gets_every_event_even_when_its_reader_lags() -> None:
    async with omnitrio.open_pipeline(_config()) as pipeline:
        client_capacity = pipeline.config.pipeline.client_capacity  # 4: far below 40
        Echo.num_steps_started = 0
        side = pipeline.open_side_stream(Request())
        for index in range(client_capacity):  # one event each: the client link's worth
            assert side.append(bytes(index + 1))
        # The last of those steps has begun: every unit of the link's credit is taken (the last by
        # that step's reservation) and nobody reads. Whatever comes now must wait.
        assert await trio.to_thread.run_sync(Echo.wait_for_steps, client_capacity, 10.0)
        for index in range(client_capacity, 40):
            assert side.append(bytes(index + 1))
        await trio.testing.wait_all_tasks_blocked()  # the stage's actor has planned them
        stats = pipeline.statistics().side_stage
        assert stats is not None
        assert stats.num_skipped_no_credit > 0  # held back for the reader ...
        assert Echo.num_steps_started == client_capacity  # ... and not one step further
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


async def test_a_flood_of_megabyte_frames_is_bounded_by_bytes_and_cut_into_pieces() -> None:
    """Round 3, row 6: one session appending 1 MiB frames as fast as it could held the
    detector's step (all of it scored at once) past its watchdog, and a gigabyte."""
    from omnitrio._pipeline import SIDE_INPUT_MAX_BYTES, SIDE_ITEM_MAX_BYTES

    async with omnitrio.open_pipeline(_config()) as pipeline:
        flood = pipeline.open_side_stream(Request())
        other = pipeline.open_side_stream(Request())
        accepted = sum(flood.append(b"\x01\x00" * (1 << 19)) for _ in range(30))  # 30 MiB
        assert accepted == 0  # each frame alone is past the bytes bound: dropped whole
        assert flood.num_dropped == 30
        frame = b"\x01\x00" * (SIDE_ITEM_MAX_BYTES * 3 // 2)  # three pieces
        while flood.append(frame):
            assert flood.queued_bytes <= SIDE_INPUT_MAX_BYTES
        assert flood.queued_bytes <= SIDE_INPUT_MAX_BYTES
        assert other.append(b"\x02\x00" * 160)  # another session is not held back
        lengths = []
        with trio.fail_after(10):
            async for event in other.stream:
                lengths.append(event.data["len"])
                break
            async for event in flood.stream:
                lengths.append(event.data["len"])
                if len(lengths) == 4:
                    break
        assert lengths == [320, SIDE_ITEM_MAX_BYTES, SIDE_ITEM_MAX_BYTES, SIDE_ITEM_MAX_BYTES]
        for side in (flood, other):
            side.close()
            await side.stream.aclose()
        assert pipeline.statistics().side_stage.num_open_streams == 0  # type: ignore[union-attr]
