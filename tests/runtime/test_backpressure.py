"""Per-stream credits: a stalled client costs only itself (seeds 000, 001, 003)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

import omnitrio
from tests.conftest import chain_config, collect

CAPACITY = 4


def _config(**overrides: object) -> omnitrio.PipelineConfig:
    """Every stage on ``placement`` (a keyword of ``overrides``; thread by default)."""
    return chain_config(
        [{"steps": 100_000, "payload_bytes": 1024}, {}, {"outputs_per_input": 0}],
        edge_capacity=CAPACITY,
        client_capacity=CAPACITY,
        **overrides,  # type: ignore[arg-type]
    )


async def _run_reader(pipeline: omnitrio.Pipeline, units: int) -> tuple[int, int, int]:
    """Run one reading stream; return (items, steps of stage a, steps of stage c) it took."""
    before = pipeline.statistics().stages
    request = omnitrio.Request("reader", options={"steps": units})
    # A guard against a hang, not a timing check: Ray stages beside two spinning
    # processes took ~90 s for 600 items.
    with trio.fail_after(180):
        async with pipeline.open_stream(request) as stream:
            items = await collect(stream)
    after = pipeline.statistics().stages
    return (
        len(items),
        after["a"].num_steps - before["a"].num_steps,
        after["c"].num_steps - before["c"].num_steps,
    )


async def test_a_stalled_client_holds_bounded_memory_and_slows_nobody(placement: str) -> None:
    # Every item crosses a Ray actor by RPC under placement ray: fewer units keep the
    # test short beside a busy CPU (items per step, its measure, do not depend on it).
    units = 200 if placement == "thread" else 50
    async with omnitrio.open_pipeline(_config(placement=placement)) as pipeline:
        alone = await _run_reader(pipeline, units)
    config = _config(placement=placement)
    async with AsyncExitStack() as streams, omnitrio.open_pipeline(config) as pipeline:
        stalled = await streams.enter_async_context(pipeline.open_stream("never read"))
        beside = await _run_reader(pipeline, units)
        stats = pipeline.statistics()
    # Items per stage step for the reading stream: the same with a stalled neighbour.
    for stage in (1, 2):
        ratio = (beside[0] / beside[stage]) / (alone[0] / alone[stage])
        assert ratio >= 0.9, (alone, beside)
    assert beside[0] == alone[0] == 3 * units
    # The stalled stream holds at most its channels' capacity, on every edge.
    in_flight = stats.streams[stalled.id].in_flight
    assert in_flight["client"] == CAPACITY
    assert all(0 <= count <= CAPACITY for count in in_flight.values())
    assert stats.stages["a"].num_skipped_no_credit > 0


async def test_a_full_stream_is_skipped_and_never_blocks_the_batch() -> None:
    async with AsyncExitStack() as streams, omnitrio.open_pipeline(_config()) as pipeline:
        stalled = await streams.enter_async_context(pipeline.open_stream("never read"))
        await _run_reader(pipeline, 20)  # long enough to fill every channel of the stalled one
        before = pipeline.statistics().stages["a"]
        _, steps, _ = await _run_reader(pipeline, 50)
        after = pipeline.statistics().stages["a"]
        # Every step of ``a`` while the reader ran skipped the stalled stream...
        assert after.num_skipped_no_credit - before.num_skipped_no_credit >= steps
        # ... and ran a batch of just the reader.
        assert after.last_batch_size == 1
        assert pipeline.statistics().streams[stalled.id].in_flight["client"] == CAPACITY


def _queue_depth(pipeline: omnitrio.Pipeline, stage: str, stream_id: str) -> int:
    return pipeline.statistics().stages[stage].queue_depth[stream_id]


async def test_first_visible_item_is_not_queued_behind_other_streams_payloads() -> None:
    # Seed 001: stream ``flood`` keeps a deep backlog of non-visible payloads in
    # front of stage b; stream ``quick`` must get its first item within a couple of
    # b steps, not after the backlog.
    # b is slow enough (5 ms a step) that the backlog fills before flood's first item is
    # through, however busy the machine: at 1 ms a fresh-clone suite run once saw 21 queued.
    config = chain_config(
        [
            {"steps": 100_000, "outputs_per_input": 8, "visible_every": 0},
            {"service_time_ms": 5.0},
            {"outputs_per_input": 0},
        ],
        edge_capacity=64,
        client_capacity=64,
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("flood") as flood:
            await flood.receive()  # flood's payloads are flowing through b
            # Wait on the statistic until the backlog is deep (beside a busy CPU it once
            # held 21 at flood's first item); the edge's capacity, 64, is its ceiling.
            with trio.fail_after(30):
                while (backlog := _queue_depth(pipeline, "b", flood.id)) < 32:  # noqa: ASYNC110 - no event marks a statistic
                    await trio.sleep(0.005)
            b_steps = pipeline.statistics().stages["b"].num_steps
            request = omnitrio.Request("quick", options={"steps": 1})
            async with pipeline.open_stream(request) as quick:
                with trio.fail_after(5):
                    await quick.receive()
                stats = pipeline.statistics().stages["b"]
                waited = stats.num_steps - b_steps
        assert backlog >= 32
        # Behind the backlog, quick would wait >= 32 of b's steps. Not behind it, it waits
        # only for the rounds already in flight (two per stage, at a and at b) and its own:
        # how many of those b runs meanwhile depends on thread timing (3 on an idle machine,
        # 4 seen beside other work), so the bound leaves room for them and no more.
        assert waited <= 6
        # Counted from quick's first input at b instead, not a matter of timing: the
        # step running, then its own (it joined the round queued behind).
        assert stats.max_steps_to_first_step <= 2


async def test_edge_payloads_never_reach_a_client() -> None:
    # Seed 000: hidden-state-sized payloads travel stage to stage only.
    config = chain_config(
        [
            {"steps": 30, "payload_bytes": 65536, "outputs_per_input": 2},
            {},
            {"outputs_per_input": 0},
        ],
        edge_capacity=8,
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("x") as stream:
            items = await collect(stream)
        stats = pipeline.statistics()
    assert all(
        isinstance(i, omnitrio.TextDelta | omnitrio.AudioChunk | omnitrio.Event) for i in items
    )
    assert stats.num_payloads_routed == 30 * 2 + 60  # a -> b, then b -> c
    assert stats.num_items_delivered == len(items) == 30 + 60 + 60
    assert stats.num_payloads_to_client == 0


BACKLOG_UNITS = 10_000


@pytest.mark.parametrize("max_batch_size", [1, 2, 32])
async def test_a_newcomer_is_not_queued_behind_a_late_streams_backlog(
    max_batch_size: int, placement: str
) -> None:
    # Deadline-first without starvation: ``flood``'s source stage puts thousands of
    # payloads on b's edge, and flood is older (its deadline earlier) and soon late. A
    # newcomer's first step at b is still the most urgent there is: it joins the round
    # queued behind the one running (taking flood's place in a full batch), however
    # small the batch, and so waits for the running step alone, not for flood's backlog.
    # On Ray the queued round is already in the stage's process: it is held there while
    # the supervisor amends it (``RayPlacement.amend``), so the bound is the same.
    # a puts 8 payloads a step on b's edge: the backlog builds up in seconds on Ray too.
    config = chain_config(
        [
            {"steps": BACKLOG_UNITS, "outputs_per_input": 8, "visible_every": 0},
            {"service_time_ms": 2.0, "outputs_per_input": 0},
        ],
        edge_capacity=2 * BACKLOG_UNITS,
        client_capacity=64,
        max_batch_size=max_batch_size,
        placement=placement,
    )
    async with (
        omnitrio.open_pipeline(config) as pipeline,
        pipeline.open_stream("flood") as flood,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(collect, flood)  # flood's client keeps reading
        with trio.fail_after(60):
            while _queue_depth(pipeline, "b", flood.id) < 2000:  # noqa: ASYNC110 - no event marks a statistic
                await trio.sleep(0.01)
        request = omnitrio.Request("quick", options={"steps": 3})
        async with pipeline.open_stream(request) as quick:
            with trio.fail_after(10):
                await quick.receive()
            after = pipeline.statistics().stages
            backlog = after["b"].queue_depth[flood.id]
        nursery.cancel_scope.cancel()
    # Counted from quick's first input at b (and from the stream at a), by which steps
    # ended after it: not a matter of timing. Behind the backlog it would be thousands.
    assert after["b"].max_steps_to_first_step <= 2, (after["b"], backlog)
    assert after["a"].max_steps_to_first_step <= 2, after["a"]
    assert backlog >= 1000  # flood's backlog was still there: quick did not wait it out


async def test_a_stream_left_out_for_a_newcomer_keeps_every_input_in_order(
    placement: str,
) -> None:
    # At one stream a step, each newcomer takes flood's place in b's queued round: the
    # inputs flood's step had taken wait on its slot and go first into its next step.
    config = chain_config(
        [
            {"steps": 400, "visible_every": 0},
            {"service_time_ms": 1.0, "outputs_per_input": 0, "visible": "trace"},
        ],
        edge_capacity=1000,
        client_capacity=1000,
        max_batch_size=1,
        placement=placement,
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("flood") as flood:
            await flood.receive()
            for index in range(3):
                request = omnitrio.Request(f"quick{index}", options={"steps": 2})
                async with pipeline.open_stream(request) as quick:
                    assert len(await collect(quick)) == 2
            items = [*await collect(flood)]
        b = pipeline.statistics().stages["b"]
    units = [item.data["unit"] for item in items if isinstance(item, omnitrio.Event)]
    produced = [item.data["upstream_produced_s"] for item in items]
    assert units == list(range(2, 401))  # the first came before the loop
    assert produced == sorted(produced)
    assert b.max_steps_to_first_step <= 2


async def test_occupancy_counts_what_statistics_counts() -> None:
    # ``omnitrio bench`` samples ``occupancy()`` instead of the dearer ``statistics()``:
    # the same open streams, payloads waiting at each stage, and latest batches.
    async with AsyncExitStack() as streams, omnitrio.open_pipeline(_config()) as pipeline:
        stalled = await streams.enter_async_context(pipeline.open_stream("never read"))
        with trio.fail_after(30):  # its client link full, payloads wait at b
            while not _backed_up(pipeline.statistics(), stalled.id):  # noqa: ASYNC110 - no event marks a statistic
                await trio.sleep(0.005)
        now, stats = pipeline.occupancy(), pipeline.statistics()  # no checkpoint between
    assert now.num_open_streams == stats.num_open_streams == 1
    assert dict(now.queue_depth) == {
        name: sum(stage.queue_depth.values()) for name, stage in stats.stages.items()
    }
    assert now.queue_depth["b"] > 0
    assert dict(now.last_batch_size) == {n: s.last_batch_size for n, s in stats.stages.items()}


def _backed_up(stats: omnitrio.PipelineStatistics, stream_id: str) -> bool:
    full = stats.streams[stream_id].in_flight["client"] == CAPACITY
    return full and stats.stages["b"].queue_depth[stream_id] > 0
