"""The supervisor and the Python API, with real worker threads on real time."""

from __future__ import annotations

import sys
import time
from contextlib import AsyncExitStack

import pytest
import trio
import trio.testing

import omnitrio
from stages.synthetic import Gate, live_streams
from tests.conftest import chain_config, collect, count_tasks, stage_threads, texts

THREE = [{"steps": 5}, {}, {"outputs_per_input": 0, "visible": "audio"}]


async def test_a_stream_gets_every_stage_output_in_order(placement: str) -> None:
    async with (
        omnitrio.open_pipeline(chain_config(THREE, placement=placement)) as pipeline,
        pipeline.open_stream("hi") as stream,
    ):
        items = await collect(stream)
    for stage in "ab":  # stages interleave; each stage's items keep their order
        assert [t for t in texts(items) if t.startswith(stage)] == [
            f"{stage}:{i} " for i in range(1, 6)
        ]
    audio = [i for i in items if isinstance(i, omnitrio.AudioChunk)]
    assert len(audio) == 5
    assert all(a.sample_rate_hz == 16000 and len(a.pcm16) == 640 for a in audio)


async def test_per_stage_order_holds_under_concurrency() -> None:
    config = chain_config(THREE, max_streams=16)
    results: dict[int, list[str]] = {}
    async with omnitrio.open_pipeline(config) as pipeline:

        async def run(index: int) -> None:
            options = {"steps": 3 + index}
            async with pipeline.open_stream(omnitrio.Request("x", options=options)) as stream:
                results[index] = texts(await collect(stream))

        async with trio.open_nursery() as nursery:
            for index in range(12):
                nursery.start_soon(run, index)
        stats = pipeline.statistics()
    for index, got in results.items():
        steps = 3 + index
        assert [t for t in got if t.startswith("a:")] == [f"a:{i} " for i in range(1, steps + 1)]
        assert [t for t in got if t.startswith("b:")] == [f"b:{i} " for i in range(1, steps + 1)]
    assert stats.num_completed == 12
    assert stats.stages["a"].largest_batch_size > 1  # streams really were batched


async def test_startup_loads_stages_in_order_and_teardown_leaves_nothing() -> None:
    tasks_before = count_tasks()
    async with omnitrio.open_pipeline(chain_config(THREE)) as pipeline:
        assert [t.name for t in stage_threads()] == [
            "omnitrio-stage-a",
            "omnitrio-stage-b",
            "omnitrio-stage-c",
        ]
        assert list(pipeline.statistics().stages) == ["a", "b", "c"]
    assert stage_threads() == []
    assert count_tasks() == tasks_before


async def test_the_gil_switch_interval_is_the_runtimes_while_pipelines_run() -> None:
    from omnitrio._pipeline import SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    assert before != SWITCH_INTERVAL_S
    async with omnitrio.open_pipeline(chain_config(THREE)) as first:
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        async with (
            omnitrio.open_pipeline(chain_config(THREE)) as second,
            second.open_stream("hi") as stream,
        ):
            assert texts(await collect(stream))
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)  # first still runs
        async with first.open_stream("hi") as stream:
            assert texts(await collect(stream))
    assert sys.getswitchinterval() == before


async def test_overloaded_at_once_beyond_max_streams() -> None:
    config = chain_config([{"steps": 1000}, {"outputs_per_input": 0}], max_streams=2)
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("1"), pipeline.open_stream("2"):
            started = trio.current_time()
            with pytest.raises(omnitrio.Overloaded, match="max_streams=2"):
                async with pipeline.open_stream("3"):
                    pass  # pragma: no cover
            assert trio.current_time() - started < 0.1
            assert pipeline.statistics().num_refused == 1
        # Slots come back once streams are released.
        async with pipeline.open_stream(omnitrio.Request("4", options={"steps": 1})) as stream:
            await collect(stream)


async def test_cancelling_a_stream_frees_its_state_everywhere(placement: str) -> None:
    config = chain_config([{"steps": 10_000}, {}, {"outputs_per_input": 0}], placement=placement)
    async with omnitrio.open_pipeline(config) as pipeline:
        async with trio.open_nursery() as nursery:
            other: list[omnitrio.VisibleItem] = []

            async def run_other() -> None:
                request = omnitrio.Request("other", options={"steps": 30})
                async with pipeline.open_stream(request) as stream:
                    other.extend(await collect(stream))

            async with pipeline.open_stream("doomed") as doomed:
                nursery.start_soon(run_other)
                for _ in range(5):
                    await doomed.receive()
                assert len(pipeline.statistics().streams[doomed.id].held_by) == 3
            # Leaving the block waited for every stage to free it.
            stats = pipeline.statistics()
            assert doomed.id not in stats.streams
            assert all(doomed.id not in s.queue_depth for s in stats.stages.values())
            assert not any(sid == doomed.id for _, sid in live_streams())
            with pytest.raises(trio.ClosedResourceError):
                await doomed.receive()
        for stage in "ab":
            got = [t for t in texts(other) if t.startswith(stage)]
            assert got == [f"{stage}:{i} " for i in range(1, 31)]
        stats = pipeline.statistics()
        assert stats.num_cancelled == 1
        # Both streams are gone from every stage, wherever it runs.
        assert all(s.model["num_open_streams"] == 0 for s in stats.stages.values())


async def test_leaving_with_producers_on_full_channels_is_prompt_and_clean(placement: str) -> None:
    config = chain_config(
        [{"steps": 100_000}, {}, {"outputs_per_input": 0}], max_streams=8, placement=placement
    )
    tasks_before = count_tasks()
    threads_before = len(stage_threads())
    async with AsyncExitStack() as streams, omnitrio.open_pipeline(config) as pipeline:
        stalled = [await streams.enter_async_context(pipeline.open_stream("s")) for _ in range(4)]
        # A short stream that runs many steps alongside: afterwards every stalled
        # stream has filled its channels (they were in every batch until full).
        async with pipeline.open_stream(omnitrio.Request("x", options={"steps": 40})) as s:
            await collect(s)
        stats = pipeline.statistics()
        for stream in stalled:
            assert stats.streams[stream.id].in_flight["client"] == 4
        assert stats.stages["a"].num_skipped_no_credit > 0
        started = time.perf_counter()
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0
    assert len(stage_threads()) == threads_before == 0
    assert count_tasks() == tasks_before
    for stream in stalled:
        assert isinstance(stream.failure, omnitrio.PipelineClosed)


async def test_keyboard_interrupt_in_the_body_tears_down_and_propagates() -> None:
    with pytest.raises(KeyboardInterrupt):
        async with AsyncExitStack() as streams, omnitrio.open_pipeline(chain_config(THREE)) as p:
            request = omnitrio.Request("left open", options={"steps": 10_000})
            await streams.enter_async_context(p.open_stream(request))
            raise KeyboardInterrupt
    assert stage_threads() == []


async def test_body_errors_come_out_unwrapped() -> None:
    with pytest.raises(ValueError, match="boom"):
        async with omnitrio.open_pipeline(chain_config(THREE)):
            raise ValueError("boom")


async def test_statistics_are_frozen_snapshots() -> None:
    async with omnitrio.open_pipeline(chain_config(THREE)) as pipeline:
        stats = pipeline.statistics()
        with pytest.raises(AttributeError):
            stats.num_open_streams = 3  # type: ignore[misc]
        with pytest.raises(TypeError):
            stats.stages["x"] = stats.stages["a"]  # type: ignore[index]
        async with pipeline.open_stream("hi") as stream:
            await collect(stream)
        assert stats.stages["a"].num_steps == 0  # the old snapshot did not move
        assert pipeline.statistics().stages["a"].num_steps == 5


async def test_open_stream_after_close_is_refused() -> None:
    async with omnitrio.open_pipeline(chain_config(THREE)) as pipeline:
        pass
    with pytest.raises(omnitrio.PipelineClosed):
        async with pipeline.open_stream("late"):
            pass  # pragma: no cover


async def test_cancel_during_a_step_frees_the_stream_at_the_next_boundary() -> None:
    gate = Gate.named("test-cancel-during-step")
    gate.close()
    config = chain_config(
        [{"steps": 3}, {"gate": "test-cancel-during-step"}, {"outputs_per_input": 0}]
    )
    try:
        async with omnitrio.open_pipeline(config) as pipeline:
            async with pipeline.open_stream("x") as stream:
                # Stage b is now stuck inside a step that holds the stream.
                assert await trio.to_thread.run_sync(gate.wait_until_blocked, 10.0)
                closed = trio.Event()

                async def close() -> None:
                    await stream.aclose()
                    closed.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(close)
                    await trio.testing.wait_all_tasks_blocked()
                    assert not closed.is_set()  # b cannot let go mid-step
                    assert ("b", stream.id) in live_streams()
                    gate.open()
                    with trio.fail_after(5):
                        await closed.wait()
                assert not any(sid == stream.id for _, sid in live_streams())
                assert pipeline.statistics().stages["b"].num_open_streams == 0
            # The stage serves on.
            async with pipeline.open_stream("y") as other:
                assert len(texts(await collect(other))) == 9
    finally:
        gate.open()


async def test_a_stream_with_no_input_for_a_stage_ends_there_without_waiting_for_a_step() -> None:
    # b ends_without_input: y brings it nothing (a makes no unit for it), so b ends y on
    # trio at once, never opening it, while its step for x is stuck: y does not wait
    # behind that step (nor behind a second round queued after it).
    gate = Gate.named("test-ends-without-input")
    gate.close()
    config = chain_config(
        [
            {"steps": 1},
            {"gate": "test-ends-without-input", "ends_without_input": True, "outputs_per_input": 0},
        ]
    )
    try:
        async with (
            omnitrio.open_pipeline(config) as pipeline,
            pipeline.open_stream("x") as held,
        ):
            assert await trio.to_thread.run_sync(gate.wait_until_blocked, 10.0)
            empty_request = omnitrio.Request("y", options={"steps": 0})
            with trio.fail_after(2):
                async with pipeline.open_stream(empty_request) as empty:
                    assert await collect(empty) == []
            assert ("b", empty.id) not in live_streams()
            assert pipeline.statistics().stages["b"].num_open_streams == 1  # x alone
            gate.open()
            assert texts(await collect(held)) == ["a:1 ", "b:1 "]
    finally:
        gate.open()


async def test_cpu_bound_stages_hold_the_gil_and_still_complete() -> None:
    config = chain_config(
        [
            {"steps": 5, "service_time_ms": 2.0, "cpu_bound": True},
            {"cpu_bound": True, "service_time_ms": 2.0, "outputs_per_input": 0},
        ]
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("x") as stream:
            assert len(texts(await collect(stream))) == 10
        assert pipeline.statistics().stages["a"].busy_s >= 5 * 0.002


async def test_a_steady_run_wakes_no_stage_for_nothing() -> None:
    # Targeted wake-ups: a stage is woken only by a change it waits for (an input,
    # credit it was short of, a new or ended stream), so none plans for nothing.
    config = chain_config([{"steps": 40}, {}, {"outputs_per_input": 0}], max_streams=16)
    async with omnitrio.open_pipeline(config) as pipeline:

        async def run() -> None:
            async with pipeline.open_stream("x") as stream:
                await collect(stream)

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(run)
        stats = pipeline.statistics()
    assert stats.num_completed == 16
    assert {name: s.num_empty_plans for name, s in stats.stages.items()} == {
        "a": 0,
        "b": 0,
        "c": 0,
    }
    assert all(s.num_steps >= 40 for s in stats.stages.values())


async def test_the_live_streams_most_lag_and_deadlines_are_kept_between_rounds() -> None:
    # Admission asks for the live streams' largest lag and (admission: cpu's startup
    # guard) the earliest playback deadline not yet past at each admission; they are
    # kept from one scan until a round puts audio or a stream ends. b makes 20 ms of
    # audio per stream-step in 1 + 25 ms per stream: behind real time, each stream by its
    # own amount.
    stages = [
        {"steps": 100_000, "visible_every": 0},
        {"outputs_per_input": 0, "visible": "audio", "service_time_ms": 1.0, "per_stream_ms": 25.0},
    ]
    config = chain_config(stages, max_streams=8)
    config = config.model_copy(
        update={"pipeline": config.pipeline.model_copy(update={"admission": "max_streams"})}
    )

    def scanned(pipeline: omnitrio.Pipeline) -> tuple[float, list[float]]:
        live = [
            s for s in pipeline._streams.values() if not s.ending and s.first_audio_at_s is not None
        ]
        guards = pipeline._admission.startup.guards
        return (
            max((s.lag_s for s in live), default=0.0),
            sorted(s.deadline_s for s in live if guards(s.audio_s)),
        )

    checked = 0
    async with omnitrio.open_pipeline(config) as pipeline, AsyncExitStack() as stack:
        live = pipeline._live
        assert live.scan()[:2] == (0.0, [])
        assert live.least_slack_s() == float("inf")
        streams = []
        for steps in (40, 25, 60):
            request = omnitrio.Request("x", options={"steps": steps})
            streams.append(await stack.enter_async_context(pipeline.open_stream(request)))
            assert live.scan()[:2] == scanned(pipeline)  # admitted: no audio yet, kept
            async for _ in streams[-1]:
                assert live.scan()[:2] == scanned(pipeline)
                checked += 1
                break
        lags = set()
        async with trio.open_nursery() as nursery:

            async def read(stream: omnitrio.Stream) -> None:
                nonlocal checked
                async for _ in stream:
                    most_lag_s, deadlines, _ = live.scan()
                    assert (most_lag_s, deadlines) == scanned(pipeline)
                    lags.add(most_lag_s)
                    slack_s = live.least_slack_s()  # the nearest deadline not yet past
                    assert slack_s >= 0.0
                    assert slack_s == float("inf") or any(
                        d - slack_s == pytest.approx(time.perf_counter(), abs=0.05)
                        for d in deadlines
                    )
                    checked += 1

            for stream in streams:
                nursery.start_soon(read, stream)
        assert live.scan()[:2] == scanned(pipeline) == (0.0, [])  # none live
    assert checked == 125
    assert len(lags) > 10  # the lag moved: the kept value was scanned again
