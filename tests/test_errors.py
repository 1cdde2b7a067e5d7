"""Failures stay with the stream they belong to; the pipeline keeps serving."""

from __future__ import annotations

import pytest
import trio

import omnitrio
from stages.synthetic import SyntheticFailure, live_streams
from tests.conftest import chain_config, collect, stage_threads, texts

THREE = [{"steps": 20}, {}, {"outputs_per_input": 0}]


async def _outcome(pipeline: omnitrio.Pipeline, request: omnitrio.Request) -> tuple[list, object]:
    items: list[omnitrio.VisibleItem] = []
    async with pipeline.open_stream(request) as stream:
        try:
            async for item in stream:
                items.append(item)
        except omnitrio.StageError as exc:
            return items, exc
    return items, None


async def test_an_exception_in_one_streams_work_fails_only_that_stream() -> None:
    results: dict[str, tuple[list, object]] = {}
    async with omnitrio.open_pipeline(chain_config(THREE)) as pipeline:

        async def run(label: str, options: dict[str, int]) -> None:
            results[label] = await _outcome(pipeline, omnitrio.Request(label, options=options))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "ok1", {})
            nursery.start_soon(run, "bad", {"b.fail_after_units": 3})
            nursery.start_soon(run, "ok2", {})
        stats = pipeline.statistics()
    items, error = results["bad"]
    assert isinstance(error, omnitrio.StageError)
    assert error.stage == "b"
    assert f"stage 'b' failed stream '{error.stream_id}'" in str(error)
    assert isinstance(error.__cause__, SyntheticFailure)
    # Nothing made before the failure is lost.
    assert [t for t in texts(items) if t.startswith("b:")] == ["b:1 ", "b:2 ", "b:3 "]
    for label in ("ok1", "ok2"):
        items, error = results[label]
        assert error is None
        assert len([t for t in texts(items) if t.startswith("b:")]) == 20
    assert (stats.num_failed, stats.num_completed) == (1, 2)
    assert stats.stages["b"].num_stream_failures == 1
    assert live_streams() == set()


async def test_a_whole_step_failure_fails_its_batch_and_the_stage_serves_on() -> None:
    config = chain_config([{"steps": 5}, {"fail_step_at": 2}, {"outputs_per_input": 0}])
    results: list[tuple[list, object]] = []
    async with omnitrio.open_pipeline(config) as pipeline:

        async def run(index: int) -> None:
            results.append(await _outcome(pipeline, omnitrio.Request(str(index))))

        async with trio.open_nursery() as nursery:
            for index in range(3):
                nursery.start_soon(run, index)
        failed = [e for _, e in results if e is not None]
        assert failed
        for error in failed:
            assert isinstance(error, omnitrio.StageError)
            assert error.stage == "b"
            assert "step raised SyntheticFailure" in str(error)
        assert pipeline.statistics().stages["b"].num_step_failures == 1
        # The pipeline keeps serving.
        items, error = await _outcome(pipeline, omnitrio.Request("after"))
        assert error is None
        assert len(texts(items)) == 15


async def test_open_stream_failure_fails_that_stream() -> None:
    async with omnitrio.open_pipeline(chain_config(THREE)) as pipeline:
        _, error = await _outcome(pipeline, omnitrio.Request("x", options={"c.fail_open": True}))
        assert isinstance(error, omnitrio.StageError)
        assert (error.stage, "open_stream raised SyntheticFailure") == (
            "c",
            error.problem.split(":")[0],
        )
        _, error = await _outcome(pipeline, omnitrio.Request("y"))
        assert error is None


@pytest.mark.parametrize(
    ("impl", "problem"),
    [
        ("tests.misbehaving:LeakyStage", "non-visible dict among visible items"),
        ("tests.misbehaving:StuckStage", "neither more nor done after input closed"),
        ("tests.misbehaving:ChattyStage", "2 visible items in one step"),
    ],
)
async def test_protocol_violations_fail_the_stream_with_a_clear_error(
    impl: str, problem: str
) -> None:
    config = chain_config([{}], impls=[impl])
    async with omnitrio.open_pipeline(config) as pipeline:
        items, error = await _outcome(pipeline, omnitrio.Request("x"))
        assert isinstance(error, omnitrio.StageError)
        assert problem in str(error)
        assert all(isinstance(i, omnitrio.TextDelta) for i in items)
        assert pipeline.statistics().num_payloads_to_client == 0


async def test_a_stage_that_fails_to_load_stops_the_ones_already_started() -> None:
    config = chain_config([{"steps": 1}, {"inputs_per_step": 0}])
    with pytest.raises(omnitrio.StageLoadError, match="stage 'b' failed to load: ValueError"):
        async with omnitrio.open_pipeline(config):
            pass  # pragma: no cover
    assert stage_threads() == []


async def test_an_object_that_is_not_a_stage_is_refused_at_load() -> None:
    config = chain_config([{}], impls=["tests.misbehaving:NotAStage"])
    with pytest.raises(omnitrio.StageLoadError, match="does not implement the Stage protocol"):
        async with omnitrio.open_pipeline(config):
            pass  # pragma: no cover


async def test_stage_capacity_too_small_for_one_step_is_a_config_error() -> None:
    config = chain_config([{"steps": 1, "outputs_per_input": 9}, {}], edge_capacity=4)
    with pytest.raises(omnitrio.ConfigError, match="max_payloads_per_step=9; raise the capacity"):
        async with omnitrio.open_pipeline(config):
            pass  # pragma: no cover


async def test_items_made_before_a_failure_are_readable_and_then_it_raises() -> None:
    config = chain_config([{"steps": 20, "fail_after_units": 5}])
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("x") as stream:
            with pytest.raises(omnitrio.StageError) as caught:
                await collect(stream)
        assert caught.value.stage == "a"
