"""The ``omnitrio bench`` command line: its arguments. The runtime's CLI lists the
command and hands everything after ``bench`` to ``cli.py``, which parses it here."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from ..baselines._vllm_omni_settings import PACKAGING_MS

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_CONFIG = REPO / "configs" / "bench-omni.yaml"
BASELINES = (
    "omnitrio-round-robin",
    "vllm-omni-model",
    "vllm-omni-model-sem512",
    "vllm-omni-model-today",
    "orchestrator-shape",
    "pipecat",
    "sequential",
    "sglang-omni",
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``omnitrio bench``'s arguments, from what follows ``bench`` on the command line."""
    bench = argparse.ArgumentParser(
        prog="omnitrio bench",
        description="Benchmark a pipeline or a server against baselines (streaming metrics).",
    )
    what = bench.add_argument_group("what to drive")
    what.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="pipeline YAML")
    what.add_argument("--url", help="drive a running server (http://127.0.0.1:PORT) instead")
    what.add_argument("--api", choices=("realtime", "chat"), default="realtime")
    what.add_argument("--framing", choices=("json", "msgpack"), default="msgpack")
    what.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --url")
    what.add_argument(
        "--baseline", action="append", choices=BASELINES, default=[], help="repeatable"
    )
    what.add_argument(
        "--baselines-only",
        action="store_true",
        help="leave omnitrio's pipeline (or --url) out: run the baselines alone",
    )
    what.add_argument("--monolithic", help="a module:factory for a monolithic generate baseline")
    what.add_argument(
        "--model-path", type=Path, help="local model folder for the stages that load one"
    )
    what.add_argument("--cpu-bound", action="store_true", help="synthetic stages hold the GIL")
    what.add_argument(
        "--host-ms",
        help="synthetic stages' GIL-held host time per step, ms, for every target alike; "
        "a list (0,1,2,4) sweeps it, each value's targets named with it",
    )
    what.add_argument(
        "--placement",
        choices=("thread", "ray"),
        help="place every stage of omnitrio's pipeline so (ray: a process per stage)",
    )
    what.add_argument(
        "--max-streams", type=int, help="override the config's pipeline.max_streams (every target)"
    )
    what.add_argument(
        "--model-packaging-ms",
        type=float,
        default=PACKAGING_MS,
        help="vllm-omni model: talker payload packaging per step, GIL held (seed 002; "
        "on the engine loop's path, or beside it in vllm-omni-model-today: PR 4476)",
    )
    what.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.PARAM=VALUE",
        help="override a stage parameter of --config (YAML value; repeatable)",
    )
    load = bench.add_argument_group("load")
    load.add_argument("--num-prompts", type=int, help="per run (default 4 x concurrency)")
    load.add_argument("--max-concurrency", type=int, default=4)
    load.add_argument("--sweep", help="concurrency levels, e.g. 1,4,16,64,128")
    load.add_argument(
        "--load-fractions",
        help="open loop: Poisson arrivals at these fractions of the profile's computed "
        "capacity, e.g. 0.5,0.9,1.1 (synthetic configs; refused arrivals are not retried)",
    )
    load.add_argument(
        "--open-loop-s", type=float, default=20.0, help="open loop: seconds of arrivals per run"
    )
    load.add_argument("--repeat", type=int, default=1, help="runs of each load and target")
    load.add_argument(
        "--find-limit",
        metavar="CAPS",
        help="sweep fixed caps (e.g. 48,56,60,64) for the true real-time limit, then "
        "headroom admission against it (closed loop, in-process; _limit.py)",
    )
    load.add_argument("--request-rate", type=float, default=math.inf, help="req/s (inf: all)")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1: Poisson)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--warmup", type=int, default=0, help="unmeasured prompts per run")
    load.add_argument("--input-len", type=int, default=32, help="words per prompt")
    load.add_argument("--output-len", type=int, default=32, help="text tokens per answer")
    load.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a request option for in-process targets, e.g. temperature=0 (repeatable)",
    )
    load.add_argument(
        "--read-speed", type=float, help="clients play audio at this x real time (0.5: slow)"
    )
    load.add_argument("--time-limit-s", type=float, default=120.0, help="bound on each run")
    out = bench.add_argument_group("output")
    out.add_argument("--json", type=Path, help="write every record and aggregate here")
    out.add_argument("--markdown", type=Path, help="write the tables here")
    out.add_argument("--plots", type=Path, help="write PNG plots to this folder (matplotlib)")
    out.add_argument("--no-progress", action="store_true")
    return bench.parse_args(argv)
