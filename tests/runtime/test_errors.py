"""Failures stay with the stream they belong to; the pipeline keeps serving."""

from __future__ import annotations

import time

import pytest
import trio

import omnitrio
from stages.synthetic import Gate, SyntheticFailure, live_streams
from stages.synthetic import _live as synthetic_live
from tests.conftest import SYNTHETIC, Announced, chain_config, collect, stage_threads, texts

FAULTS = "stages.faults:FaultInjector"

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


async def test_an_exception_in_one_streams_work_fails_only_that_stream(placement: str) -> None:
    results: dict[str, tuple[list, object]] = {}
    async with omnitrio.open_pipeline(chain_config(THREE, placement=placement)) as pipeline:

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


# The first stage opens a stream and steps it in the same turn; later stages open it first.
@pytest.mark.parametrize("stage", ["a", "c"])
async def test_open_stream_failure_fails_that_stream(stage: str) -> None:
    async with omnitrio.open_pipeline(chain_config(THREE)) as pipeline:
        request = omnitrio.Request("x", options={f"{stage}.fail_open": True})
        _, error = await _outcome(pipeline, request)
        assert isinstance(error, omnitrio.StageError)
        assert (error.stage, "open_stream raised SyntheticFailure") == (
            stage,
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


async def test_a_stage_that_fails_to_load_stops_the_ones_already_started(
    placement: str,
) -> None:
    config = chain_config([{"steps": 1}, {"inputs_per_step": 0}], placement=placement)
    with pytest.raises(omnitrio.StageLoadError, match="stage 'b' failed to load: ValueError"):
        async with omnitrio.open_pipeline(config):
            pass  # pragma: no cover
    assert stage_threads() == []


async def test_an_object_that_is_not_a_stage_is_refused_at_load() -> None:
    config = chain_config([{}], impls=["tests.misbehaving:NotAStage"])
    with pytest.raises(omnitrio.StageLoadError, match="does not implement the Stage protocol"):
        async with omnitrio.open_pipeline(config):
            pass  # pragma: no cover


def test_stage_capacity_too_small_for_one_step_is_a_config_error_when_parsed() -> None:
    # SyntheticStage declares its limits for its params (step_limits): the config is
    # refused as it is parsed, before any stage is constructed or thread started.
    constructed = set(synthetic_live)
    with pytest.raises(omnitrio.ConfigError) as caught:
        chain_config([{"steps": 1, "outputs_per_input": 9}, {}], edge_capacity=4)
    assert caught.value.key == "edges[from=a].capacity"
    assert "below stage 'a' max_payloads_per_step=9; raise the capacity" in str(caught.value)
    assert set(synthetic_live) == constructed
    assert stage_threads() == []
    with pytest.raises(omnitrio.ConfigError) as caught:
        chain_config([{"steps": 1, "visible_every": "often"}])
    assert caught.value.key == "stages[0].params"


async def test_limits_known_only_once_a_stage_loads_are_checked_as_it_loads() -> None:
    # A stage that declares nothing on its class (and the fault injector wrapping it,
    # which asks the stage it wraps): nothing to read at parse time, so open_pipeline
    # checks the limits as the stage loads, before any stream.
    undeclared = "tests.misbehaving:LimitsOnLoadStage"
    inner = {"impl": undeclared, "params": {"max_payloads_per_step": 9}}
    for impl, params in ((undeclared, inner["params"]), (FAULTS, inner)):
        config = chain_config([params, {}], edge_capacity=4, impls=[impl, SYNTHETIC])
        with pytest.raises(omnitrio.ConfigError, match="max_payloads_per_step=9; raise the"):
            async with omnitrio.open_pipeline(config):
                pass  # pragma: no cover


async def test_items_made_before_a_failure_are_readable_and_then_it_raises() -> None:
    config = chain_config([{"steps": 20, "fail_after_units": 5}])
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("x") as stream:
            with pytest.raises(omnitrio.StageError) as caught:
                await collect(stream)
        assert caught.value.stage == "a"


async def test_malformed_outputs_fail_only_their_stream() -> None:
    config = chain_config([{}], impls=["tests.misbehaving:MalformedStage"])
    async with omnitrio.open_pipeline(config) as pipeline:
        results: dict[str, tuple[list, object]] = {}

        async def run(mode: str) -> None:
            request = omnitrio.Request(mode, options={"mode": mode})
            results[mode] = await _outcome(pipeline, request)

        async with trio.open_nursery() as nursery:
            for mode in ("none-payloads", "string-error", "not-an-output", "fine"):
                nursery.start_soon(run, mode)
        assert results["fine"] == ([omnitrio.TextDelta("ok")], None)
        problems = {
            "none-payloads": "StreamOutput.payloads and .visible must be tuples",
            "string-error": "StreamOutput.error is a str, not an Exception",
            "not-an-output": "step returned a str for a stream, not a StreamOutput",
        }
        for mode, problem in problems.items():
            _, error = results[mode]
            assert isinstance(error, omnitrio.StageError)
            assert problem in str(error)
        # Outputs for streams not in the batch are reported, not blamed on the batch.
        assert pipeline.statistics().stages["a"].num_step_failures >= 1


async def test_inter_stage_objects_cannot_ride_inside_an_event() -> None:
    config = chain_config([{}], impls=["tests.misbehaving:HiddenInEventStage"])
    async with omnitrio.open_pipeline(config) as pipeline:
        items, error = await _outcome(pipeline, omnitrio.Request("x"))
        assert items == []
        assert isinstance(error, omnitrio.StageError)
        assert "Event.data.hidden is a object; events carry JSON-like data only" in str(error)


async def test_a_stage_that_frees_credit_wakes_the_stream_s_other_stages() -> None:
    # b reserves client credit every step but emits on every other one; a, skipped
    # for want of that credit, must be woken when b hands the credit back unused.
    config = chain_config(
        [{"steps": 20}, {"visible_every": 2, "outputs_per_input": 0, "service_time_ms": 5}],
        client_capacity=1,
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        for _ in range(3):
            async with pipeline.open_stream("x") as stream:
                with trio.fail_after(10):
                    items = await collect(stream)
            assert len(items) == 20 + 10


async def test_leaving_by_exception_with_a_stuck_step_is_bounded() -> None:
    gate = Gate.named("test-stuck-step")
    config = chain_config([{"steps": 100, "gate": "test-stuck-step"}], shutdown_timeout_s=0.5)
    gate.close()
    try:
        with trio.fail_after(5), pytest.raises(ValueError, match="client went away"):
            async with omnitrio.open_pipeline(config) as pipeline, pipeline.open_stream("x"):
                assert await trio.to_thread.run_sync(gate.wait_until_blocked, 5.0)
                left = time.perf_counter()  # timed from the exception, not the pipeline's start
                raise ValueError("client went away")
        # The stream's and the stage's bounds (0.5 s each); beside a busy CPU the start
        # and the stage's load alone once took over 3 s, so they are not counted.
        assert time.perf_counter() - left < 3.0
    finally:
        gate.open()
        for thread in stage_threads():  # the stuck step ends now; let its thread finish
            await trio.to_thread.run_sync(thread.join, 5.0)


async def test_body_errors_keep_their_context() -> None:
    with pytest.raises(ValueError, match="second") as caught:
        async with omnitrio.open_pipeline(chain_config([{"steps": 1}])):
            try:
                raise KeyError("first")
            except KeyError:
                raise ValueError("second") from None
    assert caught.value.__suppress_context__
    with pytest.raises(ValueError, match="second") as caught:
        async with omnitrio.open_pipeline(chain_config([{"steps": 1}])):
            try:
                raise KeyError("first")
            except KeyError:
                raise ValueError("second")  # noqa: B904 - the implicit context is the point
    assert isinstance(caught.value.__context__, KeyError)


async def test_a_hung_stage_is_reported_and_fails_only_its_streams(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate.named("test-hung-stage")
    gate.close()
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "hang", "shutdown_timeout_s": 0.5},
            "stages": [
                {"name": "a", "impl": "stages.synthetic:SyntheticStage", "params": {"steps": 3}},
                {
                    "name": "b",
                    "impl": "stages.synthetic:SyntheticStage",
                    "step_timeout_s": 0.3,
                    "params": {"outputs_per_input": 0, "gate": "test-hung-stage"},
                },
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
    )
    try:
        async with omnitrio.open_pipeline(config) as pipeline:
            with trio.fail_after(10):
                _, error = await _outcome(pipeline, omnitrio.Request("x"))
                assert isinstance(error, omnitrio.StageError)
                assert error.stage == "b"
                assert "watchdog raised TimeoutError: step did not return within" in str(error)
                assert pipeline.statistics().stages["b"].hung
                # Later streams fail at once at the hung stage instead of waiting forever.
                _, later = await _outcome(pipeline, omnitrio.Request("y"))
                assert isinstance(later, omnitrio.StageError)
                assert pipeline.statistics().num_open_streams == 0
        hung_logs = [r for r in caplog.records if "is hung" in r.getMessage()]
        assert hung_logs
        assert "streams in flight: s0" in hung_logs[0].getMessage()
    finally:
        gate.open()
        for thread in stage_threads():  # the stuck step ends now; let its thread finish
            await trio.to_thread.run_sync(thread.join, 5.0)


async def test_a_stream_whose_downstream_stage_fails_stops_upstream_too() -> None:
    # The edge's receiver goes away: the upstream stage drops the stream at its
    # next step boundary instead of producing into the void.
    config = chain_config([{"steps": 100_000}, {"fail_after_units": 2, "outputs_per_input": 0}])
    async with omnitrio.open_pipeline(config) as pipeline:
        with trio.fail_after(10):
            _, error = await _outcome(pipeline, omnitrio.Request("x"))
            assert isinstance(error, omnitrio.StageError)
            assert error.stage == "b"
            stats = pipeline.statistics()
            assert stats.num_open_streams == 0
            assert stats.stages["a"].num_steps < 100  # it did not run on
            # A short stream (below b's failure point) still completes.
            _, error = await _outcome(pipeline, omnitrio.Request("y", options={"steps": 1}))
            assert error is None


async def test_a_hung_stage_serves_again_once_its_step_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A hang of bounded length: the watchdog fails the stream in the stuck step;
    # when the step returns the stage serves again and the failure stays reported.
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "hang", "shutdown_timeout_s": 5.0},
            "stages": [
                {"name": "a", "impl": "stages.synthetic:SyntheticStage", "params": {"steps": 3}},
                {
                    "name": "b",
                    "impl": "stages.faults:FaultInjector",
                    "step_timeout_s": 0.3,
                    "params": {
                        "impl": "stages.synthetic:SyntheticStage",
                        "params": {"outputs_per_input": 0},
                    },
                },
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        with trio.fail_after(20), Announced("b", "is back") as back:
            stuck = omnitrio.Request("x", options={"fault.hang_at": 1, "fault.hang_s": 1.5})
            _, error = await _outcome(pipeline, stuck)
            assert isinstance(error, omnitrio.StageError)
            assert "watchdog raised TimeoutError" in str(error)
            assert pipeline.statistics().stages["b"].hung
            assert not back.is_set()
            await back.wait()  # the stuck step returned (after its 1.5 s)
            assert not pipeline.statistics().stages["b"].hung
            items, error = await _outcome(pipeline, omnitrio.Request("y"))
            assert error is None
            assert len(items) == 6  # 3 from each stage: served again
            stats = pipeline.statistics()
            assert (stats.num_failed, stats.num_completed) == (1, 1)
            assert stats.stages["b"].num_open_streams == 0
    assert any("is back" in r.getMessage() for r in caplog.records)
