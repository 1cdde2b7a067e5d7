"""``omnitrio bench --find-limit``: a pipeline's true real-time limit, by sweep, and what
admission by headroom admits against it.

The *true limit* is the largest fixed cap at which every stream stays continuous:
for each cap in the sweep, omnitrio runs with ``admission: max_streams`` at that cap
and a closed loop of that many clients (each sends its next request when the last
one ends), and the cap passes when every request completed and every completed one
was continuous. Continuous by two rules, each with its own limit:

- **gaps** (``_metrics``, vllm-omni's): no single underrun over
  ``CONTINUITY_THRESHOLD_S`` for a player that restarts after each stall. Streams made
  at half real time in 80 ms chunks pass it (each stall is 80 ms), yet stutter;
- **buffered**: a player that buffers the pipeline's ``client_buffer_s`` before it
  starts waits at most ``BUFFERED_TOLERANCE_S`` in all (``buffered_stall_s``): what a
  listener hears, and the rule headroom's length rule targets.

Each rule passes caps the other fails: streams in lockstep past a whole batch
(``bench-omni.yaml`` at 72-80) stall over 100 ms once a chunk yet end within a 0.25 s
buffer; streams made at 0.68x in 80 ms chunks (the thinker at 0.6 ms a stream, 36 in
lockstep) never stall 100 ms at once yet end past the buffer. So a third limit,
**both**: the largest cap whose streams were continuous by both rules, reported beside
the other two as a yardstick for headroom (a cap past it runs some stream dry by one of
them); it is the smallest of the three by construction.

Then
omnitrio runs with ``admission: headroom`` (``max_streams`` raised to the largest cap
swept, so only headroom refuses) under a closed loop of that many clients, and
reports the streams it admitted (the open streams sampled during the run: median and
peak) against the limit, with its continuity. Then the same in **open loop**:
arrivals at ``OPEN_LOOP_LOAD`` times the rate the closed-loop limit's run completed
(Poisson, for ``--open-loop-s``; a refused request stays refused), first under each
fixed cap (the open-loop limit: the largest cap whose admitted streams all stayed
continuous; arrivals one at a time take a prefill each, so it may lie below the
closed loop's; where even the least cap given let a stream play discontinuously by
both rules, lower caps are run until one holds, ``below``), then under headroom. An
open loop's median counts its ramp-up and drain, so headroom's is reported against the
limit and against the median the limit's own cap held under the same arrivals.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from omnitrio import PipelineConfig

from ._inprocess import open_pipeline_target
from ._record import AudioArrival
from ._report import report_run
from ._runner import LoadSettings, RunResult, default_progress_stream, run_load
from ._target import Prompt

OPEN_LOOP_LOAD = 1.5
"""Open-loop arrivals at this many times the rate the limit's run completed."""
BUFFERED_TOLERANCE_S = 0.02
"""What a buffering player may wait in all and still count as continuous (a frame)."""
BELOW_RESOLUTION = 1 / 16
"""Below the caps given, the open-loop limit is searched to this share of it (``below``)."""
RULES = ("both", "gaps", "buffered")
"""The continuity rules a limit is found by (``CapRun.held``); ``both`` is headroom's."""


@dataclass(frozen=True)
class CapRun:
    """One closed-loop run: ``cap`` clients against ``admission`` (and its cap)."""

    cap: int
    admission: str
    num_completed: int
    num_failed: int
    num_refused: int
    continuity_rate: float | None
    requests_per_s: float
    open_streams_p50: float | None
    open_streams_max: int | None
    buffered_rate: float | None = None
    """Share of completed requests with audio continuous for a buffering player."""
    arrivals_per_s: float | None = None
    """Open loop: the arrival rate (None: a closed loop of ``cap`` clients)."""

    @property
    def continuous(self) -> bool:
        """Every request completed, and every one with audio played without a gap."""
        return self._all_completed and (self.continuity_rate is None or self.continuity_rate >= 1)

    @property
    def buffered_continuous(self) -> bool:
        """Every request completed, and every one played through a buffering player."""
        return self._all_completed and (self.buffered_rate is None or self.buffered_rate >= 1)

    def held(self, rule: str) -> bool:
        """Every stream continuous by ``rule``: ``gaps``, ``buffered`` or ``both``."""
        if rule not in RULES:
            raise ValueError(f"no continuity rule {rule!r}; one of {', '.join(RULES)}")
        gaps = self.continuous if rule != "buffered" else True
        return gaps and (self.buffered_continuous if rule != "gaps" else True)

    @property
    def _all_completed(self) -> bool:
        """None failed, and in a closed loop none refused (in open loop a fixed cap's
        refusals are what it turns away, as headroom's are)."""
        refused = self.num_refused and self.arrivals_per_s is None
        return self.num_failed == 0 and not refused


def buffered_stall_s(chunks: Sequence[AudioArrival], buffer_s: float) -> float:
    """How long, in all, a player that starts ``buffer_s`` after the first chunk and
    plays chunks back to back waits for audio."""
    if not chunks:
        return 0.0
    play_end_s = chunks[0].at_s + buffer_s + chunks[0].duration_s
    stalled_s = 0.0
    for chunk in chunks[1:]:
        stalled_s += max(0.0, chunk.at_s - play_end_s)
        play_end_s = max(play_end_s, chunk.at_s) + chunk.duration_s
    return stalled_s


def _with_admission(config: PipelineConfig, admission: str, cap: int) -> PipelineConfig:
    section = config.pipeline.model_copy(update={"admission": admission, "max_streams": cap})
    return config.model_copy(update={"pipeline": section})


def _cap_run(
    run: RunResult, cap: int, admission: str, buffer_s: float, arrivals_per_s: float | None = None
) -> CapRun:
    aggregates = report_run(run, None).aggregates
    counts = [s.open_streams for s in run.samples if s.open_streams is not None]
    played = [r.audio for r in run.records if r.outcome == "completed" and r.audio]
    held = [buffered_stall_s(audio, buffer_s) <= BUFFERED_TOLERANCE_S for audio in played]
    return CapRun(
        cap=cap,
        admission=admission,
        num_completed=aggregates.num_completed,
        num_failed=aggregates.num_failed,
        num_refused=aggregates.num_refused,
        continuity_rate=aggregates.continuity_rate,
        requests_per_s=aggregates.throughput.requests_per_s,
        open_streams_p50=statistics.median(counts) if counts else None,
        open_streams_max=max(counts) if counts else None,
        buffered_rate=sum(held) / len(held) if held else None,
        arrivals_per_s=arrivals_per_s,
    )


async def _closed_loop(
    config: PipelineConfig,
    admission: str,
    cap: int,
    clients: int,
    prompts: Sequence[Prompt],
    args: argparse.Namespace,
    arrivals_per_s: float | None = None,
) -> CapRun:
    """A closed loop of ``clients``, or with ``arrivals_per_s`` an open loop of
    ``prompts`` arriving at that rate (refusals stay refused)."""
    if arrivals_per_s is None:
        settings = LoadSettings(max_concurrency=clients, time_limit_s=args.time_limit_s)
    else:
        settings = LoadSettings(
            max_concurrency=len(prompts),
            request_rate=arrivals_per_s,
            retry=False,
            seed=args.seed,
            time_limit_s=args.time_limit_s,
        )
    progress = None if args.no_progress else default_progress_stream()
    name = f"omnitrio {admission} cap={cap}"
    async with open_pipeline_target(_with_admission(config, admission, cap), name) as target:
        run = await run_load(target, prompts, settings, progress_out=progress)
    return _cap_run(run, cap, admission, config.pipeline.client_buffer_s, arrivals_per_s)


def true_limit(
    runs: Sequence[CapRun], *, rule: str = "gaps", open_loop: bool = False
) -> int | None:
    """The largest cap whose fixed-cap run (closed loop, or ``open_loop``) kept every
    stream it admitted continuous by ``rule`` (``CapRun.held``: the gaps rule, the
    buffering player's, or both; None: none did)."""
    passed = [
        run.cap
        for run in runs
        if run.admission == "max_streams"
        and (run.arrivals_per_s is not None) == open_loop
        and run.held(rule)
    ]
    return max(passed) if passed else None


def below(runs: Sequence[CapRun], caps: Sequence[int], rule: str = "both") -> int | None:
    """The next cap to run in open loop where even the least of ``caps`` (those given)
    let a stream play discontinuously by ``rule`` (None: it did not, or the limit is
    found): down by a quarter from the least cap run until one holds, then halfway
    between the largest that held and the least above it that did not, to
    ``BELOW_RESOLUTION`` of it."""
    fixed = [run for run in runs if run.admission == "max_streams" and run.arrivals_per_s]
    held = [run.cap for run in fixed if run.held(rule)]
    failed = [run.cap for run in fixed if not run.held(rule)]
    least = min(failed, default=None)
    if least is None or least > min(caps) or (held and max(held) > least):
        return None  # the caps given hold the limit
    if not held:
        cap = least * 3 // 4
        return cap if 1 <= cap < least else None
    top = max(held)
    if least - top <= max(1, int(top * BELOW_RESOLUTION)):
        return None
    return (top + least) // 2


async def find_limit(args: argparse.Namespace, config: PipelineConfig) -> list[CapRun]:
    """Sweep ``args.find_limit``'s caps with ``max_streams``, then headroom at the largest."""
    from .cli import make_prompts  # here: cli imports this module

    caps = sorted({int(cap) for cap in args.find_limit.split(",")})
    if not caps or caps[0] < 1:
        raise ValueError(f"--find-limit: give caps of at least 1, got {args.find_limit!r}")
    runs: list[CapRun] = []
    for cap in caps:
        count = args.num_prompts or 4 * cap
        prompts = make_prompts(count, args.input_len, args.output_len, args.seed, args.option)
        runs.append(await _closed_loop(config, "max_streams", cap, cap, prompts, args))
    top = caps[-1]
    count = args.num_prompts or 4 * top
    prompts = make_prompts(count, args.input_len, args.output_len, args.seed, args.option)
    runs.append(await _closed_loop(config, "headroom", top, top, prompts, args))
    limit = true_limit(runs) or top
    carried = next(run for run in runs if run.cap == limit and run.admission == "max_streams")
    rate = OPEN_LOOP_LOAD * carried.requests_per_s
    count = args.num_prompts or max(1, round(rate * args.open_loop_s))
    prompts = make_prompts(count, args.input_len, args.output_len, args.seed, args.option)
    for cap in caps:  # the same caps under the same arrivals: the open-loop limit
        runs.append(await _closed_loop(config, "max_streams", cap, count, prompts, args, rate))
    while (lower := below(runs, caps)) is not None:  # none held by both: search below
        runs.append(await _closed_loop(config, "max_streams", lower, count, prompts, args, rate))
    runs.append(await _closed_loop(config, "headroom", top, count, prompts, args, rate))
    return runs


def _loop(run: CapRun) -> str:
    return "closed loop" if run.arrivals_per_s is None else "open loop"


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1%}"


def _held(runs: Sequence[CapRun], cap: int, arrivals_per_s: float | None) -> float | None:
    """The median streams the fixed ``cap`` held under the same open-loop arrivals."""
    return next(
        (
            run.open_streams_p50
            for run in runs
            if run.admission == "max_streams"
            and run.cap == cap
            and run.arrivals_per_s == arrivals_per_s
            and run.open_streams_p50
        ),
        None,
    )


def limit_table(runs: Sequence[CapRun]) -> str:
    """The sweep, then the headroom run against the true limits, as markdown."""
    rows = [
        "| admission | cap | clients | ok/fail/refused | continuity (gaps) | continuity "
        "(buffered) | req/s | open streams p50 / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        clients = run.cap if run.arrivals_per_s is None else f"open loop {run.arrivals_per_s:.1f}/s"
        rows.append(
            f"| {run.admission} | {run.cap} | {clients} | {run.num_completed}/{run.num_failed}/"
            f"{run.num_refused} | {_rate(run.continuity_rate)} | {_rate(run.buffered_rate)} | "
            f"{run.requests_per_s:.1f} | "
            f"{run.open_streams_p50 if run.open_streams_p50 is not None else '-'} / "
            f"{run.open_streams_max if run.open_streams_max is not None else '-'} |"
        )
    lines = ["\n".join(rows), ""]
    headroom = [run for run in runs if run.admission == "headroom"]
    for rule, open_loop in itertools.product(RULES, (False, True)):
        loop = "open loop" if open_loop else "closed loop"
        limit = true_limit(runs, rule=rule, open_loop=open_loop)
        if limit is None:
            lines.append(
                f"- true real-time limit ({rule}, {loop}): no cap swept kept every stream "
                "continuous"
            )
            continue
        lines.append(
            f"- true real-time limit ({rule}, {loop}, largest continuous cap swept): {limit}"
        )
        for run in headroom:
            if (run.arrivals_per_s is not None) != open_loop:
                continue
            median = run.open_streams_p50
            share = "" if median is None else f" ({median / limit:.0%} of it)"
            lines.append(
                f"  - headroom ({_loop(run)}) admitted a median of {median} streams{share}"
            )
            held = _held(runs, limit, run.arrivals_per_s) if open_loop else None
            if held is not None and median is not None:
                lines.append(
                    f"  - the cap of {limit} itself held a median of {held} under the same "
                    f"arrivals (its ramp-up and drain counted too): headroom {median / held:.0%} "
                    "of it"
                )
    for run in headroom:
        lines.append(
            f"- headroom ({_loop(run)}) admitted at most {run.open_streams_max} streams, "
            f"refused {run.num_refused}; continuity {_rate(run.continuity_rate)} (gaps), "
            f"{_rate(run.buffered_rate)} (buffered)"
        )
    return "\n".join(lines) + "\n"
