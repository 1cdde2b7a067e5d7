"""A stage's error says where it happened as fields, so no caller parses its text."""

from __future__ import annotations

import omnitrio
from tests.conftest import chain_config

THREE = [{"steps": 20}, {}, {"outputs_per_input": 0}]


async def _error(request: omnitrio.Request) -> omnitrio.StageError:
    async with (
        omnitrio.open_pipeline(chain_config(THREE)) as pipeline,
        pipeline.open_stream(request) as stream,
    ):
        try:
            async for _ in stream:
                pass
        except omnitrio.StageError as exc:
            return exc
    raise AssertionError("the stream did not fail")


async def test_open_stream_and_step_failures_are_told_apart_by_field() -> None:
    opened = await _error(omnitrio.Request("x", options={"b.fail_open": True}))
    assert (opened.stage, opened.during) == ("b", "open_stream")
    stepped = await _error(omnitrio.Request("x", options={"b.fail_after_units": 2}))
    assert (stepped.stage, stepped.during) == ("b", "step")
