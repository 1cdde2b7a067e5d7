"""``omnitrio bench``: run a workload against omnitrio and baselines, side by side, and report.

The runtime's command line (``omnitrio/_cli.py``) imports this module only when the
command runs: ``parse_args`` reads what follows ``bench``, and ``bench`` is the job.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import yaml

from omnitrio import PipelineConfig, Scalar, load_config, with_model_path

from ..baselines._monolithic import SEQUENTIAL, open_monolithic
from ..baselines._orchestrator_shape import open_orchestrator_shape
from ..baselines._vllm_omni_settings import ModelSettings, variant
from ._args import REPO
from ._args import parse_args as parse_args
from ._http import Endpoint
from ._inprocess import open_pipeline_target
from ._overrides import with_cpu_bound, with_host_ms, with_params, with_placement
from ._profile import (
    capacity_requests_per_s,
    ideal_first_audio_s,
    max_continuous_streams,
    open_loop_capacity_requests_per_s,
    synthetic_profiles,
)
from ._report import (
    RunReport,
    markdown_table,
    ratio_table,
    report_run,
    spread_table,
    to_json,
    wave_table,
)
from ._runner import LoadSettings, default_progress_stream, run_load
from ._server import ChatTarget, RealtimeTarget, wait_until_serving
from ._target import Prompt, Target

OpenTarget = Callable[[], AbstractAsyncContextManager[Target]]


def _levels(args: argparse.Namespace) -> list[int]:
    if args.load_fractions and not args.sweep:
        return []
    if not args.sweep:
        return [args.max_concurrency]
    return [int(level) for level in args.sweep.split(",")]


def _fractions(args: argparse.Namespace) -> list[float]:
    return [float(f) for f in args.load_fractions.split(",")] if args.load_fractions else []


@dataclass(frozen=True)
class _Load:
    settings: LoadSettings
    num_prompts: int
    ideal_ttfa_s: float | None


def _loads(args: argparse.Namespace, context: dict[str, Any]) -> list[_Load]:
    """The closed-loop levels, then the open-loop rates, in the order they run."""
    workload = context["workload"]
    common = {
        "burstiness": args.burstiness,
        "seed": args.seed,
        "time_limit_s": args.time_limit_s,
        "read_speed": args.read_speed,
    }
    loads = [
        _Load(
            LoadSettings(max_concurrency=level, request_rate=args.request_rate, **common),
            args.num_prompts or 4 * level,
            None if args.url else workload.get("ideal_ttfa_s", {}).get(level),
        )
        for level in _levels(args)
    ]
    for fraction in _fractions(args):
        if "capacity_requests_per_s" not in workload:
            raise ValueError("--load-fractions needs a config of synthetic stages (a profile)")
        rate = fraction * workload["capacity_requests_per_s"]
        count = args.num_prompts or max(1, round(rate * args.open_loop_s))
        settings = LoadSettings(max_concurrency=count, request_rate=rate, retry=False, **common)
        loads.append(_Load(settings, count, None))
    return loads


def make_prompts(
    count: int, input_len: int, output_len: int, seed: int, options: Sequence[str] = ()
) -> list[Prompt]:
    rng = random.Random(seed)
    pairs = tuple(_option(text) for text in options)
    return [
        Prompt(i, " ".join(f"w{rng.randrange(10000)}" for _ in range(input_len)), output_len, pairs)
        for i in range(count)
    ]


def _option(text: str) -> tuple[str, Scalar]:
    key, sep, raw = text.partition("=")
    value = yaml.safe_load(raw) if sep else None
    if not sep or not key or not isinstance(value, str | int | float | bool):
        raise ValueError(f"--option {text!r}: give KEY=VALUE with a plain value")
    return key, value


def _host_ms(args: argparse.Namespace) -> list[float | None]:
    if not args.host_ms:
        return [None]
    values = [float(v) for v in args.host_ms.split(",")]
    if any(v < 0 for v in values):
        raise ValueError(f"--host-ms: give times of at least 0 ms, got {args.host_ms!r}")
    return list(values)


def _named(open_target: OpenTarget, suffix: str) -> OpenTarget:
    """``open_target`` with ``suffix`` added to its target's name."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Target]:
        async with open_target() as target:
            target.name = f"{target.name}{suffix}"
            yield target

    return opened


def _targets(args: argparse.Namespace, config: PipelineConfig) -> list[OpenTarget]:
    targets: list[OpenTarget] = []
    if args.url:
        endpoint = Endpoint.parse(args.url, allow_remote=args.allow_remote)
        if args.api == "realtime" and importlib.util.find_spec("trio_websocket") is None:
            raise ValueError("--api realtime needs trio-websocket: pip install -e '.[bench]'")

        @asynccontextmanager
        async def server() -> AsyncIterator[Target]:
            await wait_until_serving(endpoint, 10.0)
            yield (
                RealtimeTarget(endpoint, args.framing)
                if args.api == "realtime"
                else ChatTarget(endpoint)
            )

        targets.append(server)
    elif not args.baselines_only:
        targets.append(lambda: open_pipeline_target(config))
    for name in dict.fromkeys(args.baseline):
        if name == "omnitrio-round-robin":  # the runtime before deadlines and headroom
            section = config.pipeline.model_copy(
                update={"scheduling": "round_robin", "admission": "max_streams"}
            )
            targets.append(
                partial(
                    open_pipeline_target,
                    config.model_copy(update={"pipeline": section}),
                    "omnitrio-round-robin",
                )
            )
        elif name == "orchestrator-shape":
            targets.append(lambda: open_orchestrator_shape(config))
        elif name.startswith("vllm-omni-model"):
            if importlib.util.find_spec("zmq") is None:
                raise ValueError(f"--baseline {name} needs pyzmq: pip install -e '.[bench]'")
            if importlib.util.find_spec("torch") is None:  # its head holds torch tensors
                raise ValueError(f"--baseline {name} needs torch: pip install -e '.[models]'")
            settings = variant(name, args.model_packaging_ms)
            targets.append(_model_target(config, settings, name))
        elif name == "sequential":
            targets.append(lambda: open_monolithic(config, SEQUENTIAL))
        elif name == "sglang-omni":
            targets.append(_sglang_omni_target(config))
        elif name == "pipecat":
            try:  # an optional extra: imported only when asked for
                from ..baselines._pipecat import open_pipecat
            except ImportError as exc:
                print(
                    f"omnitrio bench: skipping the pipecat baseline ({exc}); "
                    "install it with: pip install -e '.[bench]'",
                    file=sys.stderr,
                )
                continue
            targets.append(lambda: open_pipecat(config))
    if args.monolithic:
        targets.append(lambda: open_monolithic(config, args.monolithic))
    if not targets:
        raise ValueError("omnitrio bench: --baselines-only needs at least one --baseline")
    return targets


def _model_target(config: PipelineConfig, settings: ModelSettings, name: str) -> OpenTarget:
    from ..baselines._vllm_omni_model import open_vllm_omni_model  # needs pyzmq, the bench extra

    return lambda: open_vllm_omni_model(config, settings, name)


def _sglang_omni_target(config: PipelineConfig) -> OpenTarget:
    """The real sglang-omni runtime, in its own environment (checked before any run)."""
    from ..baselines._sglang_omni import open_sglang_omni, peer_python
    from ..baselines._sglang_omni_spec import peer_spec

    peer_python()  # PeerUnavailable (naming the setup command) before anything runs
    peer_spec(config)  # and PeerConfigError for a config it cannot run
    return lambda: open_sglang_omni(config)


def _context(args: argparse.Namespace, config: PipelineConfig) -> dict[str, Any]:
    profiles = synthetic_profiles(config)
    workload: dict[str, Any] = {"config": str(args.config), "pipeline": config.pipeline.name}
    if profiles is not None:
        workload |= {
            # omnitrio admits at most max_streams at once: the rest wait, refused.
            "ideal_ttfa_s": {level: _ideal_ttfa_s(args, config, level) for level in _levels(args)},
            # open-loop arrivals come one at a time: one prefill each
            "capacity_requests_per_s": open_loop_capacity_requests_per_s(
                profiles, args.output_len, num_words=args.input_len
            ),
            # a zero-overhead runtime at each level, with at most max_streams admitted
            "zero_overhead_requests_per_s": {
                level: capacity_requests_per_s(
                    profiles,
                    args.output_len,
                    min(level, config.pipeline.max_streams),
                    args.input_len,
                )
                for level in _levels(args)
            },
            "open_loop_requests_per_s": {
                fraction: fraction
                * open_loop_capacity_requests_per_s(
                    profiles, args.output_len, num_words=args.input_len
                )
                for fraction in _fractions(args)
            },
            "max_continuous_streams": max_continuous_streams(profiles),
            "max_streams": config.pipeline.max_streams,
        }
    return {
        "command": ["omnitrio", "bench", *sys.argv[2:]],
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "commit": _commit(),
        },
        "workload": workload,
    }


def _ideal_ttfa_s(args: argparse.Namespace, config: PipelineConfig, level: int) -> float | None:
    """The zero-overhead TTFA at ``level`` streams (at most max_streams admitted)."""
    profiles = synthetic_profiles(config)
    if profiles is None:
        return None
    streams = min(level, config.pipeline.max_streams)
    return ideal_first_audio_s(profiles, args.output_len, args.input_len, streams)


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
    except OSError:
        return None
    return done.stdout.strip() or None


async def bench(args: argparse.Namespace) -> None:
    config = load_config(args.config)  # the file's own errors first
    if args.set:
        config = with_params(args.config, args.set)
    if args.model_path is not None:
        config = with_model_path(config, args.model_path)
    if args.cpu_bound:
        config = with_cpu_bound(config)
    if args.placement:
        config = with_placement(config, args.placement)
    if args.max_streams is not None:
        section = config.pipeline.model_copy(update={"max_streams": args.max_streams})
        config = config.model_copy(update={"pipeline": section})
    if args.repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
    host_ms = _host_ms(args)
    if len(host_ms) == 1:
        config = with_host_ms(config, host_ms[0])
    if args.find_limit:  # the true real-time limit against headroom (_limit.py)
        from ._limit import find_limit, limit_table

        print(limit_table(await find_limit(args, config)))
        return
    context = _context(args, config)
    loads = _loads(args, context)
    progress = None if args.no_progress else default_progress_stream()
    reports: list[RunReport] = []
    targets = [(target, config) for target in _targets(args, config)]
    if len(host_ms) > 1:  # a sweep: every target at every host time, named with it
        swept = [with_host_ms(config, value) for value in host_ms]
        targets = [
            (_named(target, f" host={value:g}ms"), at)
            for value, at in zip(host_ms, swept, strict=True)
            for target in _targets(args, at)
        ]
    warmup = make_prompts(args.warmup, args.input_len, args.output_len, args.seed + 1, args.option)
    for load in loads:
        prompts = make_prompts(
            load.num_prompts, args.input_len, args.output_len, args.seed, args.option
        )
        for repetition in range(args.repeat):  # repetitions interleave the targets
            for open_target, target_config in targets:
                async with open_target() as target:
                    run = await run_load(
                        target,
                        prompts,
                        load.settings,
                        warmup=warmup,
                        progress_out=progress,
                        repetition=repetition,
                    )
                    _note_peer(context, target)
                ideal_s = load.ideal_ttfa_s
                if ideal_s is not None and target_config is not config:  # its own host time
                    ideal_s = _ideal_ttfa_s(args, target_config, load.settings.max_concurrency)
                reports.append(report_run(run, ideal_s))
    _write(args, reports, context)


def _note_peer(context: dict[str, Any], target: Target) -> None:
    """A real peer's version and stand-in modules (``peer_report``), for the report."""
    report = getattr(target, "peer_report", None)
    if callable(report):
        context.setdefault("peers", {})[target.name] = report()


def _write(args: argparse.Namespace, reports: list[RunReport], context: dict[str, Any]) -> None:
    subject = reports[0].run.target
    sections = [
        "## Results (times in ms)\n\n" + markdown_table(reports),
        "## TTFA per wave, median (ms)\n\n" + wave_table(reports),
    ]
    ratios = ratio_table(reports, subject)
    if ratios:
        sections.append(f"## {subject} / baseline (below 1 is better for times)\n\n" + ratios)
        sections.append(
            f"## {subject} / baseline over the repetitions: median [min-max] (n)\n\n"
            + spread_table(reports, subject)
        )
    workload = context["workload"]
    if "ideal_ttfa_s" in workload:
        sections.append(
            "## Workload: the zero-overhead bound (from the stage profile)\n\n"
            "- ideal TTFA (stages only, streams started together): "
            + ", ".join(
                f"{level} streams {ideal * 1000:.1f} ms"
                for level, ideal in workload["ideal_ttfa_s"].items()
                if ideal is not None
            )
            + "\n- zero-overhead throughput: "
            + ", ".join(
                f"{level} streams {rate:.1f} req/s"
                for level, rate in workload["zero_overhead_requests_per_s"].items()
            )
            + "\n"
            f"- open-loop capacity (one prefill per arrival): "
            f"{workload['capacity_requests_per_s']:.1f} req/s\n"
            f"- most streams that keep real time: {workload['max_continuous_streams']} "
            f"(max_streams {workload['max_streams']})"
        )
    for name, peer in context.get("peers", {}).items():
        sections.append(f"## Peer: {name}\n\n" + "\n".join(f"- {k}: {v}" for k, v in peer.items()))
    text = "\n\n".join(sections) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(to_json(reports, context))
    if args.plots:
        from ._plots import write_plots  # matplotlib is an optional extra

        for path in write_plots(reports, args.plots, context):
            print(f"wrote {path}")
