"""Micro-benchmark of the runtime's own cost: per-hop latency and routing throughput.

Usage (from the repository root)::

    python benchmarks/runtime_micro.py [--streams 1,16,128] [--items N] [--repeats 3]
                                       [--pace-ms 1.0] [--gap-steps 400] [--json out.json]

Besides the hops below, every run also measures, in the same process:

- the **crossing floor**: a no-op job sent to a dedicated worker thread and back
  (``WorkerThread.run``: one crossing in, one ``run_sync_soon`` back), median and
  p99 of 2,000. A stage->stage hop needs one crossing back from the upstream
  thread and one into the downstream thread, so the floor is what a hop cannot
  beat; the paced ``stage1->stage2`` median is reported as a multiple of it, and
  its growth per extra stream in a batch;
- the **channel floor** per stream, at each level n of ``--streams``: n trio memory
  channels (capacity 8, the default edge's), one item each; ``send`` is
  ``send_nowait`` into every channel, ``send+receive`` also ``receive_nowait``
  from every one, and ``wake`` has one task per channel blocked in ``receive()``,
  woken by the send, the round ending when the last has run (a ``trio.Event``).
  Median of 300 rounds, each divided by n, and the growth per extra stream
  against n = 1: the least a design with one channel per stream per edge pays per
  stream per hop, next to the hop's own growth per stream;
- the **step gap** of a saturated stage: a one-stage pipeline (``GapProbe``, below)
  whose step sleeps 1 ms (the GIL released, as a GPU stage's would be) and always
  asks for more, with a client reading every item; the stage records when each
  step starts and ends on its thread, and the gap is the next start minus the
  previous end: the time the thread waited for the runtime between steps.

What runs
---------
A three-stage chain of ``stages.synthetic:SyntheticStage``, built in code with
``omnitrio.parse_config``: ``stage1`` (source mode, ``steps`` units per stream)
-> ``stage2`` -> ``stage3`` (input mode). Every stage has ``service_time_ms 0``
and emits one ``Event("trace")`` per unit, so a unit is 2 edge payloads plus 3
visible items and what is timed is the runtime: scheduling, the two thread
crossings per step, channel puts and takes, wake-ups and client delivery.
Edge capacity (8), client capacity (16) and ``max_batch_size`` (32) stay at their
defaults, the numbers a user gets; only ``max_streams`` is raised to the largest
level. So at 128 streams a stage needs 4 turns (batches of 32) per round.

Every run gets a fresh pipeline (one warm-up run comes first); each (regime,
level) is run ``--repeats`` times, interleaved with the other regimes of its
level. Latency percentiles pool the samples of the repeats; rates are the median
of the repeats, with the spread.

Three regimes per concurrency level:

- ``saturated``: closed loop, nothing paces stage1. This gives the throughput.
  Its hop latencies measure *queueing*, not dispatch: every stage and client
  task shares the one trio thread, the edges fill, and a payload waits up to
  edge capacity x the next stage's step period (Little's law). They swing a lot
  from run to run with the order trio happens to schedule tasks in.
- ``untraced``: ``saturated`` with ``visible: text``, no timestamps read. A
  control: its throughput next to ``saturated`` is the cost of the tracing.
- ``paced``: stage1 sleeps ``--pace-ms`` per stream in its batch (a sleep releases
  the GIL: no CPU work), offering 1000 / pace_ms units/s at every level, far below
  saturation. Its hop latencies are the runtime's dispatch cost. Stage1 emits one
  burst per step (its whole batch, up to 32 streams), so at high concurrency p99
  is about the worst few bursts.

Hops (all ``time.perf_counter``, one monotonic clock shared by every thread):

- ``stage1->stage2``: ``produced_s - upstream_produced_s`` of stage2's trace, i.e.
  from stage1 stamping the payload inside its step to stage2's step reaching it:
  the rest of stage1's step, the crossing back into trio, ``_apply``, stage2's
  wake-up and plan, the crossing into stage2's thread and its step up to it.
- ``stage2->stage3``: the same from stage3's trace.
- ``stage1->stage2 batch``: per stage1 step, from its stamp to the earliest stage2
  stamp of its units: the dispatch of the batch (stage1's return, the crossing,
  ``_apply`` and stage2's plan, the crossing into stage2 and its runner) without
  stage2's own per-unit work ahead of a stream's place in its batch, which the
  per-unit hop above holds. The "per extra stream" growth of this one is the
  runtime's.
- ``stage3->client``: the client's clock when ``receive()`` returns, minus the
  ``produced_s`` of stage3's trace.

Does the tracing distort the measurement?
-----------------------------------------
A little, and the ``untraced`` control bounds it:

- The traces *are* the visible traffic: every stage emits one per unit, where a
  real omni pipeline's middle stage (the talker) emits nothing visible. That
  loads the client path, and the shared trio thread, more than production would;
  the visible items are counted in the throughput, so the rate stays honest
  about what moved.
- A trace ``Event`` (a 4-key dict frozen into a ``MappingProxyType``) costs more
  to build than a ``TextDelta``, and the traced client reads the clock, looks up
  keys and appends a float per item. ``untraced`` removes both; the ratio of the
  two rates is printed. It is within the run-to-run noise on a 2-core box.
- The stamps are taken per unit inside ``step``, so in a batch of b streams a hop
  also holds part of the producing and the consuming step (a few us per unit
  here). That is real latency, but it depends on the stream's place in the batch.
- Keeping every sample (a float per item) adds allocations, so a few more GC
  passes; GC pauses land in p99, as they would in production.
- The client's stamp includes the trio scheduling of the client task, which is
  part of delivery.

Absolute numbers are context only: the machines are shared and noisy. Compare
runs made side by side, on the same machine, in one invocation.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio
import trio.testing

import omnitrio
from omnitrio import Event, Pipeline, PipelineConfig, VisibleItem

STAGES = ("stage1", "stage2", "stage3")
HOPS = ("stage1->stage2", "stage2->stage3", "stage3->client", "stage1->stage2 batch")
"""The last is the dispatch hop of a batch: from stage1's step stamping it to stage2's
step reaching the *first* of its units, so without stage2's own work on the units
before a stream's place in its batch (see the notes)."""
DEFAULT_STREAMS = (1, 16, 128)
DEFAULT_REPEATS = 3
DEFAULT_PACE_MS = 1.0
UNPACED_UNITS_PER_RUN = 8_192
"""Default stage1 units per unpaced run, split over its streams: same work at every level."""
PACED_UNITS_PER_RUN = 1_024
"""Stage1 units per paced run, split over its streams: about 1 s at the default pace."""
WARMUP_UNITS = 256
CHANNEL_ROUNDS = 300
FLOOR_SAMPLES = 2_000
DEFAULT_GAP_STEPS = 400
GAP_SERVICE_S = 0.001


class GapProbe:
    """A source stage that records when each of its steps starts and ends on its thread."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 0
    max_visible_per_step = 1

    def __init__(self, name: str, device: str = "cpu", *, steps: int) -> None:
        self.steps = steps
        self._left: dict[str, int] = {}
        self.spans: list[tuple[float, float]] = []
        _probes.append(self)

    def open_stream(self, stream_id: str, request: omnitrio.Request) -> None:
        self._left[stream_id] = self.steps

    def step(self, batch: Sequence[omnitrio.StreamWork]) -> dict[str, omnitrio.StreamOutput]:
        started = time.perf_counter()
        time.sleep(GAP_SERVICE_S)
        outputs = {}
        for work in batch:
            left = self._left[work.stream_id] = self._left[work.stream_id] - 1
            outputs[work.stream_id] = omnitrio.StreamOutput(
                visible=(omnitrio.TextDelta("x"),), more=left > 0, done=left == 0
            )
        self.spans.append((started, time.perf_counter()))
        return outputs

    def close_stream(self, stream_id: str) -> None:
        del self._left[stream_id]

    def close(self) -> None:
        self._left.clear()


_probes: list[GapProbe] = []


@dataclass(frozen=True)
class GapResult:
    num_streams: int
    num_gaps: int
    median_us: float
    p99_us: float
    num_empty_plans: int | None
    """The stage's wake-ups that found nothing to do (None: the runtime does not count them)."""
    max_trio_stall_ms: float | None
    trio_us_per_turn: float | None
    """The trio thread's plan + apply time per turn of the stage (None: not reported)."""


@dataclass(frozen=True)
class FloorResult:
    median_us: float
    p99_us: float


async def crossing_floor() -> FloorResult:
    """A no-op round trip to a dedicated worker thread and back, as a stage's turn makes."""
    from omnitrio._worker import WorkerThread

    worker = WorkerThread("omnitrio-crossing-floor")
    samples: list[float] = []
    try:
        for _ in range(FLOOR_SAMPLES):
            started = time.perf_counter()
            await worker.run(_nothing)
            samples.append(time.perf_counter() - started)
    finally:
        await worker.stop(trio.current_time() + 5)
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return FloorResult(cuts[49] * 1e6, cuts[98] * 1e6)


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class ChannelFloor:
    num_streams: int
    send_us: float
    """Median round of ``send_nowait`` into every stream's channel, per stream."""
    send_receive_us: float
    """The same with ``receive_nowait`` from every channel, per stream."""
    wake_us: float
    """The same with one task per channel woken from ``receive()``, per stream."""


async def channel_floor(num_streams: int) -> ChannelFloor:
    """Bare trio memory-channel costs for ``num_streams`` per-stream channels."""
    pairs = [trio.open_memory_channel[int](8) for _ in range(num_streams)]
    senders = [s for s, _ in pairs]
    receivers = [r for _, r in pairs]
    send_s: list[float] = []
    both_s: list[float] = []
    for _ in range(CHANNEL_ROUNDS):
        started = time.perf_counter()
        for sender in senders:
            sender.send_nowait(0)
        sent = time.perf_counter()
        for receiver in receivers:
            receiver.receive_nowait()
        send_s.append(sent - started)
        both_s.append(time.perf_counter() - started)
    wake_s: list[float] = []
    pending = 0
    round_done = trio.Event()

    async def wait_on(receiver: trio.MemoryReceiveChannel[int]) -> None:
        nonlocal pending
        async for _ in receiver:
            pending -= 1
            if pending == 0:
                round_done.set()

    async with trio.open_nursery() as nursery:
        for receiver in receivers:
            nursery.start_soon(wait_on, receiver)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(CHANNEL_ROUNDS):
            round_done = trio.Event()
            pending = num_streams
            started = time.perf_counter()
            for sender in senders:
                sender.send_nowait(0)
            await round_done.wait()
            wake_s.append(time.perf_counter() - started)
        for sender in senders:
            await sender.aclose()
    per = 1e6 / num_streams
    return ChannelFloor(
        num_streams,
        statistics.median(send_s) * per,
        statistics.median(both_s) * per,
        statistics.median(wake_s) * per,
    )


async def step_gaps(num_streams: int, steps: int) -> GapResult:
    """Run ``num_streams`` streams of ``steps`` steps through one saturated GapProbe."""
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "step-gap", "max_streams": num_streams},
            "stages": [
                {
                    "name": "probe",
                    "impl": f"{__name__}:GapProbe",
                    "max_batch_size": num_streams,
                    "params": {"steps": steps},
                }
            ],
        },
        source="benchmarks/runtime_micro.py",
    )
    _probes.clear()

    async def client(pipeline: Pipeline) -> None:
        async with pipeline.open_stream(omnitrio.Request()) as stream:
            async for _ in stream:
                pass

    async with omnitrio.open_pipeline(config) as pipeline:
        async with trio.open_nursery() as nursery:
            for _ in range(num_streams):
                nursery.start_soon(client, pipeline)
        stats = pipeline.statistics()
    spans = _probes[0].spans
    # Leave out the ramp (streams still arriving) and the tail (streams finishing).
    steady = spans[len(spans) // 10 : len(spans) - len(spans) // 10]
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(steady)]
    cuts = statistics.quantiles(gaps, n=100, method="inclusive")
    stage = stats.stages["probe"]
    stall = getattr(stats, "max_trio_stall_s", None)
    trio_s = getattr(stage, "trio_s", None)
    return GapResult(
        num_streams,
        len(gaps),
        cuts[49] * 1e6,
        cuts[98] * 1e6,
        getattr(stage, "num_empty_plans", None),
        None if stall is None else stall * 1e3,
        None if trio_s is None else trio_s / max(1, stage.num_steps) * 1e6,
    )


@dataclass(frozen=True)
class Regime:
    name: str
    visible: str
    """What every stage emits per unit: ``trace`` (timed) or ``text`` (control)."""
    pace_ms: float
    """Stage1's ``per_stream_ms``: slept per stream in its batch (0: unpaced)."""


SATURATED = Regime("saturated", "trace", 0.0)
UNTRACED = Regime("untraced", "text", 0.0)


@dataclass(frozen=True)
class HopLatency:
    num_samples: int
    median_us: float
    p90_us: float
    p99_us: float


@dataclass(frozen=True)
class RunResult:
    """One run: one fresh pipeline, every stream run to completion."""

    wall_s: float
    num_payloads_routed: int
    num_visible_sent: int
    num_visible_delivered: int
    routed_items_per_s: float
    """(edge payloads + visible items sent by stages) / wall time."""
    delivered_items_per_s: float
    """Visible items received by clients / wall time."""
    mean_batch_size: dict[str, float]
    num_skipped_no_credit: dict[str, int]


@dataclass(frozen=True)
class LevelResult:
    """The repeats of one regime at one concurrency level."""

    regime: str
    num_streams: int
    units_per_stream: int
    runs: tuple[RunResult, ...]
    hops: dict[str, HopLatency | None]
    """Pooled over the runs; None for the untraced control."""

    def median(self, metric: str) -> float:
        return statistics.median(self._values(metric))

    def spread(self, metric: str) -> tuple[float, float]:
        values = self._values(metric)
        return min(values), max(values)

    def _values(self, metric: str) -> list[float]:
        return [float(getattr(r, metric)) for r in self.runs]


@dataclass
class _Samples:
    """Hop latencies in seconds, appended by the client tasks (one trio thread)."""

    hops_s: dict[str, list[float]] = field(default_factory=lambda: {h: [] for h in HOPS})
    num_received: int = 0
    _first_s: dict[float, float] = field(default_factory=dict)
    """Per stage1 step (its stamp): the earliest stage2 stamp of its units."""

    def batch_hops(self) -> None:
        """Fill the batch dispatch hops from the stamps recorded so far."""
        self.hops_s[HOPS[3]] = [first - up for up, first in self._first_s.items()]

    def record(self, item: VisibleItem, received_s: float) -> None:
        self.num_received += 1
        if not isinstance(item, Event) or item.data["stage"] == STAGES[0]:
            return  # untraced control, or stage1's trace (no upstream)
        produced_s = _seconds(item, "produced_s")
        hop = "stage1->stage2" if item.data["stage"] == "stage2" else "stage2->stage3"
        upstream_s = _seconds(item, "upstream_produced_s")
        self.hops_s[hop].append(produced_s - upstream_s)
        if hop == HOPS[0]:
            self._first_s[upstream_s] = min(produced_s, self._first_s.get(upstream_s, math.inf))
        if item.data["stage"] == "stage3":
            self.hops_s["stage3->client"].append(received_s - produced_s)


def _seconds(event: Event, key: str) -> float:
    value = event.data[key]
    if not isinstance(value, float):
        raise TypeError(f"trace {key} is {value!r}, not a float; is the stage in input mode?")
    return value


def build_config(max_streams: int, units_per_stream: int, regime: Regime) -> PipelineConfig:
    """The three-stage synthetic chain; capacities and batch sizes at their defaults."""

    def stage(name: str, **params: object) -> dict[str, object]:
        return {
            "name": name,
            "impl": "stages.synthetic:SyntheticStage",
            "params": {"visible": regime.visible, "service_time_ms": 0.0, **params},
        }

    return omnitrio.parse_config(
        {
            "pipeline": {"name": "runtime-micro", "max_streams": max_streams},
            "stages": [
                stage("stage1", steps=units_per_stream, per_stream_ms=regime.pace_ms),
                stage("stage2"),
                stage("stage3", outputs_per_input=0),
            ],
            "edges": [{"from": "stage1", "to": "stage2"}, {"from": "stage2", "to": "stage3"}],
        },
        source="benchmarks/runtime_micro.py",
    )


async def _client(pipeline: Pipeline, samples: _Samples) -> None:
    async with pipeline.open_stream(omnitrio.Request()) as stream:
        async for item in stream:
            samples.record(item, time.perf_counter())


async def run_once(
    regime: Regime, num_streams: int, units_per_stream: int, max_streams: int, samples: _Samples
) -> RunResult:
    """Open a fresh pipeline and run ``num_streams`` concurrent streams to completion."""
    config = build_config(max_streams, units_per_stream, regime)
    num_received_before = samples.num_received
    async with omnitrio.open_pipeline(config) as pipeline:
        started_s = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(num_streams):
                nursery.start_soon(_client, pipeline, samples)
        wall_s = time.perf_counter() - started_s
        stats = pipeline.statistics()
    num_received = samples.num_received - num_received_before
    if stats.num_completed != num_streams:
        raise RuntimeError(f"{stats.num_completed} of {num_streams} streams completed")
    if stats.num_items_delivered != num_received:
        print(
            f"warning: statistics count {stats.num_items_delivered} items delivered, "
            f"clients received {num_received}",
            file=sys.stderr,
        )
    stages = stats.stages
    num_visible = sum(s.num_visible_sent for s in stages.values())
    return RunResult(
        wall_s=wall_s,
        num_payloads_routed=stats.num_payloads_routed,
        num_visible_sent=num_visible,
        num_visible_delivered=num_received,
        routed_items_per_s=(stats.num_payloads_routed + num_visible) / wall_s,
        delivered_items_per_s=num_received / wall_s,
        mean_batch_size={n: s.mean_batch_size for n, s in stages.items()},
        num_skipped_no_credit={n: s.num_skipped_no_credit for n, s in stages.items()},
    )


def _latency(samples_s: list[float]) -> HopLatency | None:
    if not samples_s:
        return None
    if len(samples_s) == 1:
        cuts = samples_s * 99
    else:
        cuts = statistics.quantiles(samples_s, n=100, method="inclusive")
    return HopLatency(len(samples_s), cuts[49] * 1e6, cuts[89] * 1e6, cuts[98] * 1e6)


async def run_level(
    num_streams: int, regimes: Sequence[Regime], args: argparse.Namespace, max_streams: int
) -> list[LevelResult]:
    """Run every regime ``args.repeats`` times at one level, interleaved."""
    units: dict[str, int] = {}
    for regime in regimes:
        total = PACED_UNITS_PER_RUN if regime.pace_ms else UNPACED_UNITS_PER_RUN
        per_stream = args.items if args.items and not regime.pace_ms else total / num_streams
        units[regime.name] = math.ceil(per_stream)
    samples = {r.name: _Samples() for r in regimes}
    runs: dict[str, list[RunResult]] = {r.name: [] for r in regimes}
    for repeat in range(args.repeats):
        for regime in regimes:
            print(
                f"{regime.name} x{num_streams} streams, {units[regime.name]} units each, "
                f"run {repeat + 1}/{args.repeats}",
                file=sys.stderr,
            )
            run = await run_once(
                regime, num_streams, units[regime.name], max_streams, samples[regime.name]
            )
            runs[regime.name].append(run)
    for sample in samples.values():
        sample.batch_hops()
    return [
        LevelResult(
            regime=r.name,
            num_streams=num_streams,
            units_per_stream=units[r.name],
            runs=tuple(runs[r.name]),
            hops={
                h: _latency(v) if r.visible == "trace" else None
                for h, v in samples[r.name].hops_s.items()
            },
        )
        for r in regimes
    ]


async def run_all(
    args: argparse.Namespace,
) -> tuple[list[LevelResult], FloorResult, list[GapResult], list[ChannelFloor]]:
    max_streams = max(args.streams)
    regimes = (SATURATED, UNTRACED, Regime("paced", "trace", args.pace_ms))
    await run_once(SATURATED, 1, WARMUP_UNITS, max_streams, _Samples())
    floor = await crossing_floor()
    channels = [await channel_floor(n) for n in sorted({1, *args.streams})]
    results: list[LevelResult] = []
    gaps: list[GapResult] = []
    for num_streams in args.streams:
        results += await run_level(num_streams, regimes, args, max_streams)
        print(f"step gap x{num_streams} streams, {args.gap_steps} steps", file=sys.stderr)
        gaps.append(await step_gaps(num_streams, args.gap_steps))
    return results, floor, gaps, channels


def floor_and_gaps(
    results: Sequence[LevelResult],
    floor: FloorResult,
    gaps: Sequence[GapResult],
    channels: Sequence[ChannelFloor],
) -> str:
    """The crossing floor, the paced hop against it, and the step gaps."""
    paced = {r.num_streams: r.hops[HOPS[0]] for r in results if r.regime == "paced"}
    lines = [
        "",
        f"crossing floor (no-op round trip to a worker thread): median {floor.median_us:.0f} us, "
        f"p99 {floor.p99_us:.0f} us",
    ]
    one = paced.get(1)
    for num_streams, hop in sorted(paced.items()):
        if hop is None:
            continue
        line = (
            f"paced stage1->stage2 median at {num_streams} streams: {hop.median_us:.0f} us "
            f"= {hop.median_us / floor.median_us:.2f}x the floor"
        )
        if one is not None and num_streams > 1:
            per = (hop.median_us - one.median_us) / (num_streams - 1)
            line += f", {per:+.1f} us per extra stream"
        lines.append(line)
    batch = {r.num_streams: r.hops[HOPS[3]] for r in results if r.regime == "paced"}
    one_batch = batch.get(1)
    for num_streams, hop in sorted(batch.items()):
        if hop is None or one_batch is None or num_streams == 1:
            continue
        per = (hop.median_us - one_batch.median_us) / (num_streams - 1)
        lines.append(
            f"paced stage1->stage2 batch (first unit) median at {num_streams} streams: "
            f"{hop.median_us:.0f} us, {per:+.1f} us per extra stream"
        )
    lines += [
        "",
        "Channel floor: n per-stream trio memory channels, one item each, per stream, us",
        "",
        "| streams | send | send+receive | wake a waiting task | growth per extra stream "
        "(send+receive / wake) |",
        "|---:|---:|---:|---:|---|",
    ]
    base = channels[0]
    for c in channels:
        growth = "-"
        if c.num_streams > 1:
            n = c.num_streams
            both = (c.send_receive_us * n - base.send_receive_us) / (n - 1)
            wake = (c.wake_us * n - base.wake_us) / (n - 1)
            growth = f"{both:+.2f} / {wake:+.2f}"
        lines.append(
            f"| {c.num_streams} | {c.send_us:.2f} | {c.send_receive_us:.2f} | "
            f"{c.wake_us:.2f} | {growth} |"
        )
    lines += [
        "",
        "Step gap of a saturated stage (1 ms steps, every stream always ready), us",
        "",
        "| streams | gaps | median | p99 | empty plans | longest trio stall ms "
        "| trio us per turn (plan + apply) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in gaps:
        empty = "-" if g.num_empty_plans is None else str(g.num_empty_plans)
        stall = "-" if g.max_trio_stall_ms is None else f"{g.max_trio_stall_ms:.2f}"
        trio_us = "-" if g.trio_us_per_turn is None else f"{g.trio_us_per_turn:.1f}"
        lines.append(
            f"| {g.num_streams} | {g.num_gaps} | {g.median_us:.0f} | {g.p99_us:.0f} | "
            f"{empty} | {stall} | {trio_us} |"
        )
    timed = [g for g in gaps if g.trio_us_per_turn is not None]
    if len(timed) > 1 and timed[-1].num_streams > timed[0].num_streams:
        first, last = timed[0], timed[-1]
        assert first.trio_us_per_turn is not None
        assert last.trio_us_per_turn is not None
        per = (last.trio_us_per_turn - first.trio_us_per_turn) / (
            last.num_streams - first.num_streams
        )
        lines.append(
            f"\ntrio cost per extra stream in a batch ({first.num_streams} -> "
            f"{last.num_streams}): {per:.2f} us"
        )
    return "\n".join(lines)


def machine_note() -> dict[str, str]:
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cpus": str(os.cpu_count()),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "trio": trio.__version__,
        "omnitrio": omnitrio.__version__,
        "commit": commit,
    }


def markdown(results: Sequence[LevelResult], machine: dict[str, str], pace_ms: float) -> str:
    lines = [
        "machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()),
        f"paced: stage1 sleeps {pace_ms:g} ms per stream per step "
        f"({1000 / pace_ms:.0f} units/s offered at every level)",
        "",
        "Per-hop latency, us: median / p90 / p99 (samples pooled over the runs)",
        "",
        "| regime | streams | units/stream | runs | samples/hop | " + " | ".join(HOPS) + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(HOPS),
    ]
    for r in results:
        first = r.hops[HOPS[0]]
        if first is None:
            continue
        cells = " | ".join(_cell(r.hops[h]) for h in HOPS)
        lines.append(
            f"| {r.regime} | {r.num_streams} | {r.units_per_stream} | {len(r.runs)} | "
            f"{first.num_samples} | {cells} |"
        )
    lines += [
        "",
        "Throughput, median of the runs (min-max); routed = edge payloads + visible items "
        "sent by stages, delivered = visible items received by clients",
        "",
        "| regime | streams | units/stream | items/run | wall s | routed items/s "
        "| delivered items/s | mean batch 1/2/3 | skipped no-credit/run 1/2/3 |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        run = r.runs[0]
        low, high = r.spread("routed_items_per_s")
        batch = "/".join(
            f"{statistics.mean(x.mean_batch_size[s] for x in r.runs):.1f}" for s in STAGES
        )
        skipped = "/".join(
            f"{statistics.mean(x.num_skipped_no_credit[s] for x in r.runs):.0f}" for s in STAGES
        )
        lines.append(
            f"| {r.regime} | {r.num_streams} | {r.units_per_stream} | "
            f"{run.num_payloads_routed + run.num_visible_sent} | {r.median('wall_s'):.2f} | "
            f"{r.median('routed_items_per_s'):,.0f} ({low:,.0f}-{high:,.0f}) | "
            f"{r.median('delivered_items_per_s'):,.0f} | {batch} | {skipped} |"
        )
    ratios = [
        f"{t.num_streams}: {t.median('routed_items_per_s') / u.median('routed_items_per_s'):.2f}"
        for t in results
        for u in results
        if t.regime == SATURATED.name and u.regime == UNTRACED.name
        if t.num_streams == u.num_streams
    ]
    lines += ["", "tracing cost, saturated / untraced median routed items/s: " + ", ".join(ratios)]
    return "\n".join(lines)


def _cell(hop: HopLatency | None) -> str:
    if hop is None:
        return "-"
    return f"{hop.median_us:.0f} / {hop.p90_us:.0f} / {hop.p99_us:.0f}"


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
    if min(levels) < 1:
        raise argparse.ArgumentTypeError("stream counts must be at least 1")
    return levels


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--streams", type=_levels, default=DEFAULT_STREAMS, help="concurrency levels (1,16,128)"
    )
    parser.add_argument(
        "--items",
        type=_at_least_one,
        help="stage1 units per stream in the unpaced runs "
        f"(default {UNPACED_UNITS_PER_RUN} / streams: the same work at every level)",
    )
    parser.add_argument(
        "--repeats", type=_at_least_one, default=DEFAULT_REPEATS, help="runs per regime and level"
    )
    parser.add_argument(
        "--pace-ms",
        type=_positive,
        default=DEFAULT_PACE_MS,
        help="paced runs: stage1 sleep per stream per step "
        f"({PACED_UNITS_PER_RUN} units per run, split over its streams)",
    )
    parser.add_argument(
        "--gap-steps",
        type=_at_least_one,
        default=DEFAULT_GAP_STEPS,
        help="steps per stream in the step-gap runs",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    machine = machine_note()
    results, floor, gaps, channels = trio.run(run_all, args)
    print(markdown(results, machine, args.pace_ms))
    print(floor_and_gaps(results, floor, gaps, channels))
    if args.json is not None:
        document = {
            "machine": machine,
            "args": {
                "streams": list(args.streams),
                "items": args.items,
                "repeats": args.repeats,
                "pace_ms": args.pace_ms,
                "gap_steps": args.gap_steps,
            },
            "results": [asdict(r) for r in results],
            "crossing_floor": asdict(floor),
            "step_gaps": [asdict(g) for g in gaps],
            "channel_floor": [asdict(c) for c in channels],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
