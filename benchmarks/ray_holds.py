"""What the queued round's amends cost a short-step Ray stage: ``hold`` calls, steps
and the hop from an upstream step to the Ray stage's step that reaches its payload.

Usage (from the repository root, with the ray extra installed)::

    python -m benchmarks.ray_holds [--streams 4] [--units 200] [--up-ms 1] [--down-ms 3]
                                    [--repeats 3]

A two-stage synthetic chain, both stages on Ray: ``up`` makes one unit per
``--up-ms`` step for each of ``--streams`` streams; ``down`` steps every ``--down-ms``
taking up to 8 inputs a stream, so input comes for its queued round while the running
one runs (the top-up's case). Reported per run: wall time, ``down``'s steps,
``hold`` calls and holds per step, and the hop's median and p99 (``up`` stamping a
unit to ``down`` reaching it; one monotonic clock for every process on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import trio

import omnitrio
from benchmarks.ray_placement import on_ray

SYNTHETIC = "stages.synthetic:SyntheticStage"


def chain(units: int, up_ms: float, down_ms: float) -> omnitrio.PipelineConfig:
    up = {"steps": units, "service_time_ms": up_ms, "visible_every": 0}
    down = {"service_time_ms": down_ms, "inputs_per_step": 8, "outputs_per_input": 0}
    down["visible"] = "trace"
    return omnitrio.parse_config(
        {
            "pipeline": {"name": "holds", "client_capacity": 4096},
            "stages": [
                {"name": "up", "impl": SYNTHETIC, "params": up, "placement": "ray"},
                {"name": "down", "impl": SYNTHETIC, "params": down, "placement": "ray"},
            ],
            "edges": [{"from": "up", "to": "down"}],
        }
    )


async def once(args: argparse.Namespace) -> dict[str, float]:
    hops: list[float] = []
    config = chain(args.units, args.up_ms, args.down_ms)
    async with omnitrio.open_pipeline(config) as pipeline:

        async def one(index: int) -> None:
            async with pipeline.open_stream(f"s{index}") as stream:
                async for item in stream:
                    if isinstance(item, omnitrio.Event):
                        hops.append(item.data["produced_s"] - item.data["upstream_produced_s"])

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(args.streams):
                nursery.start_soon(one, index)
        wall_s = time.perf_counter() - started
        down = next(a for a in pipeline._actors if a.name == "down")
        holds = down._placement.num_holds
        steps = down.counters.num_steps
    ordered = sorted(hops)
    return {
        "wall_s": wall_s,
        "down_steps": steps,
        "holds": holds,
        "holds_per_step": holds / steps,
        "hop_median_ms": statistics.median(ordered) * 1000,
        "hop_p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    warm = argparse.Namespace(**{**vars(args), "units": 20})
    await once(warm)  # Ray's first workers
    runs = [await once(args) for _ in range(args.repeats)]
    return {
        "command": ["python", "-m", "benchmarks.ray_holds", *sys.argv[1:]],
        "load_average": os.getloadavg(),
        "omnitrio": omnitrio.__file__,
        "runs": runs,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--up-ms", type=float, default=1.0)
    parser.add_argument("--down-ms", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    print(json.dumps(on_ray(main, parser.parse_args()), indent=2))
