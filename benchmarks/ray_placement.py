"""Thread against Ray placement, side by side in one run: hop latency, CPU-bound
throughput, and the payload bytes the supervisor relays.

Usage (from the repository root, with the ray extra installed)::

    python benchmarks/ray_placement.py [--units 300] [--streams 16] [--tokens 48]
                                       [--repeats 3] [--json out.json]

One Ray instance is started first (its start-up is not timed); every run gets a
fresh pipeline, and the thread and Ray runs of a measure alternate.

- **Hop latency**: a three-stage synthetic chain (``stage1`` source, paced by a
  5 ms slept step, one stream) whose stages emit one ``Event("trace")`` per unit;
  a hop is ``produced_s - upstream_produced_s`` of the downstream stage's trace:
  from the upstream step stamping a payload to the downstream step reaching it.
  ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process
  on the machine, so stamps from two Ray actors compare.
- **CPU-bound throughput**: ``configs/bench-omni.yaml`` with ``cpu_bound: true``
  on every stage (they busy-wait their service time holding the GIL, as
  ``omnitrio bench --cpu-bound``), ``--streams`` streams of ``--tokens`` tokens
  at once; tokens per second over the whole run, all-thread against all-Ray.
- **Payload bytes relayed** by the supervisor in the CPU-bound Ray run (its
  thinker->talker payloads are 8 KiB each): 0 when every edge is Ray to Ray.
- **Ray's own costs**, what a Ray hop is made of (median of 200 each, blocking
  ``ray.get`` from this process, no omnitrio): an actor call's round trip; a call
  whose method ``ray.put``s 8 KiB; a call whose method gets 8 KiB another actor put.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import trio

import omnitrio

REPO = Path(__file__).resolve().parent.parent
PLACEMENTS = ("thread", "ray")


def placed(config: omnitrio.PipelineConfig, placement: str) -> omnitrio.PipelineConfig:
    stages = tuple(s.model_copy(update={"placement": placement}) for s in config.stages)
    return config.model_copy(update={"stages": stages})


def hop_config(units: int) -> omnitrio.PipelineConfig:
    synthetic = "stages.synthetic:SyntheticStage"
    return omnitrio.parse_config(
        {
            "pipeline": {"name": "hops", "client_capacity": 64},
            "stages": [
                {
                    "name": "stage1",
                    "impl": synthetic,
                    "params": {"steps": units, "visible": "trace", "service_time_ms": 5.0},
                },
                {"name": "stage2", "impl": synthetic, "params": {"visible": "trace"}},
                {
                    "name": "stage3",
                    "impl": synthetic,
                    "params": {"visible": "trace", "outputs_per_input": 0},
                },
            ],
            "edges": [{"from": "stage1", "to": "stage2"}, {"from": "stage2", "to": "stage3"}],
        }
    )


async def hops_once(placement: str, units: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"stage1->stage2": [], "stage2->stage3": []}
    async with (
        omnitrio.open_pipeline(placed(hop_config(units), placement)) as pipeline,
        pipeline.open_stream("hops") as stream,
    ):
        async for item in stream:
            if not isinstance(item, omnitrio.Event) or item.data["stage"] == "stage1":
                continue
            produced, upstream = item.data["produced_s"], item.data["upstream_produced_s"]
            assert isinstance(produced, float)
            assert isinstance(upstream, float)
            hop = "stage1->stage2" if item.data["stage"] == "stage2" else "stage2->stage3"
            samples[hop].append(produced - upstream)
    return samples


def cpu_bound_config() -> omnitrio.PipelineConfig:
    config = omnitrio.load_config(REPO / "configs" / "bench-omni.yaml")
    stages = tuple(
        s.model_copy(update={"params": {**s.params, "cpu_bound": True}}) for s in config.stages
    )
    return config.model_copy(update={"stages": stages})


async def throughput_once(placement: str, streams: int, tokens: int) -> tuple[float, int]:
    """(tokens per second, payload bytes the supervisor relayed)."""
    config = placed(cpu_bound_config(), placement)
    async with omnitrio.open_pipeline(config) as pipeline:
        request = omnitrio.Request("a short prompt", options={"max_tokens": tokens})

        async def one() -> None:
            async with pipeline.open_stream(request) as stream:
                async for _ in stream:
                    pass

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(one)
        elapsed_s = time.perf_counter() - started
        relayed = pipeline.statistics().num_payload_bytes_relayed
    return streams * tokens / elapsed_s, relayed


@ray.remote
class _Probe:
    def echo(self, value: int) -> int:
        return value

    def put(self) -> tuple[Any, ...]:
        return (ray.put(bytes(8192)),)

    def get(self, refs: tuple[Any, ...]) -> int:
        return len(ray.get(refs[0]))


def ray_costs_ms(repeats: int = 200) -> dict[str, float]:
    a, b = (_Probe.options(num_cpus=0).remote() for _ in range(2))  # type: ignore[attr-defined]
    ray.get([a.echo.remote(0), b.echo.remote(0)])
    refs = iter([ray.get(a.put.remote()) for _ in range(repeats)])
    calls = {
        "call_round_trip": lambda: ray.get(a.echo.remote(0)),
        "call_with_put_8KiB": lambda: ray.get(a.put.remote()),
        "call_with_get_of_another_actors_8KiB": lambda: ray.get(b.get.remote(next(refs))),
    }
    costs = {}
    for name, call in calls.items():
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            call()
            samples.append(time.perf_counter() - started)
        costs[name] = statistics.median(samples) * 1000
    for actor in (a, b):
        ray.kill(actor)
    return costs


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"median_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}


def on_ray(main: Any, arguments: argparse.Namespace) -> dict[str, Any]:
    """``trio.run(main, arguments)`` on a Ray instance started for it (its start-up not
    timed), shut down after."""
    ray.init(include_dashboard=False, logging_level="WARNING")
    try:
        report: dict[str, Any] = trio.run(main, arguments)
    finally:
        ray.shutdown()
    return report


async def main(args: argparse.Namespace) -> dict[str, Any]:
    hops: dict[str, dict[str, list[float]]] = {p: {} for p in PLACEMENTS}
    rates: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
    relayed: dict[str, list[int]] = {p: [] for p in PLACEMENTS}
    await hops_once("ray", 20)  # warm-up: Ray's first workers
    for _ in range(args.repeats):
        for placement in PLACEMENTS:
            for hop, values in (await hops_once(placement, args.units)).items():
                hops[placement].setdefault(hop, []).extend(values)
            rate, num_bytes = await throughput_once(placement, args.streams, args.tokens)
            rates[placement].append(rate)
            relayed[placement].append(num_bytes)
    return {
        "command": ["python", "benchmarks/ray_placement.py", *sys.argv[1:]],
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "hops": {p: {h: _ms(v) for h, v in hops[p].items()} for p in PLACEMENTS},
        "cpu_bound_tokens_per_s": rates,
        "cpu_bound_ratio_ray_over_thread": statistics.median(rates["ray"])
        / statistics.median(rates["thread"]),
        "payload_bytes_relayed": relayed,
        "ray_costs_ms": ray_costs_ms(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=300, help="units of the hop stream")
    parser.add_argument("--streams", type=int, default=16, help="CPU-bound streams at once")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per CPU-bound stream")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    report = on_ray(main, arguments)
    text = json.dumps(report, indent=2)
    print(text)
    if arguments.json:
        arguments.json.write_text(text + "\n")
