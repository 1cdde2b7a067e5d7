"""The load loop: send prompts on schedule, at most ``max_concurrency`` at once, and record.

Waiting here is pacing, not polling for data: requests are sent at their
scheduled times (``trio.sleep_until``), a refused request is retried after
the target's retry hint (``Overloaded.retry_after_s``, as a client honouring
``Retry-After`` would), or ``retry_after_s`` where it gave none (its times still
count from the first attempt), and the target is sampled every
``sample_interval_s``. The whole run is bounded by ``time_limit_s``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import trio

from ._arrivals import arrival_offsets_s
from ._metrics import waves_by_send_time
from ._record import RequestRecord
from ._target import Prompt, Refused, Sample, Target, TargetError, Timeline


@dataclass(frozen=True)
class LoadSettings:
    max_concurrency: int
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    time_limit_s: float = 120.0
    sample_interval_s: float = 0.1
    retry_after_s: float = 0.05
    read_speed: float | None = None  # clients play audio at this x real time (None: read at once)
    retry: bool = True  # retry a refused request (False: it stays refused, as open-loop runs do)


@dataclass(frozen=True)
class RunResult:
    target: str
    max_concurrency: int
    request_rate: float
    repetition: int
    records: tuple[RequestRecord, ...]
    samples: tuple[Sample, ...]
    timed_out: bool
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at start, end


def retry_delay_s(refusal: Refused, settings: LoadSettings) -> float:
    """How long a refused client waits: the target's hint where it gave one (the time
    until a slot frees), else ``settings.retry_after_s``."""
    hint = refusal.retry_after_s
    return settings.retry_after_s if hint is None else hint


class Progress:
    """A one-line progress bar on a terminal (silent when ``out`` is None)."""

    def __init__(self, out: TextIO | None, label: str, total: int) -> None:
        self._out, self._label, self._total = out, label, total
        self._done = self._failed = 0
        self._started = time.perf_counter()

    def update(self, failed: bool) -> None:
        self._done += 1
        self._failed += failed
        self._draw()

    def close(self) -> None:
        self._draw()
        if self._out is not None:
            self._out.write("\n")
            self._out.flush()

    def _draw(self) -> None:
        if self._out is None:
            return
        width = 24
        filled = width * self._done // max(self._total, 1)
        elapsed_s = time.perf_counter() - self._started
        self._out.write(
            f"\r{self._label:<32} [{'#' * filled}{'.' * (width - filled)}] "
            f"{self._done}/{self._total} failed {self._failed} {elapsed_s:6.1f} s"
        )
        self._out.flush()


def default_progress_stream() -> TextIO | None:
    return sys.stderr if sys.stderr.isatty() else None


async def run_load(
    target: Target,
    prompts: Sequence[Prompt],
    settings: LoadSettings,
    *,
    warmup: Sequence[Prompt] = (),
    progress_out: TextIO | None = None,
    repetition: int = 0,
) -> RunResult:
    """Run ``warmup`` (unmeasured) then ``prompts`` against ``target``; return every record."""
    records: list[RequestRecord] = []
    samples: list[Sample] = []
    label = f"{target.name} c={settings.max_concurrency}"
    progress = Progress(progress_out, label, len(warmup) + len(prompts))
    timed_out = True
    load_at_start = os.getloadavg()[0]
    with trio.move_on_after(settings.time_limit_s):
        run_start_s = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sample_forever, target, settings, run_start_s, samples)
            if warmup:
                await _send_all(target, warmup, settings, run_start_s, records, progress, True)
            await _send_all(target, prompts, settings, run_start_s, records, progress, False)
            nursery.cancel_scope.cancel()
        timed_out = False
    progress.close()
    records = waves_by_send_time(records, settings.max_concurrency)
    return RunResult(
        target=target.name,
        max_concurrency=settings.max_concurrency,
        request_rate=settings.request_rate,
        repetition=repetition,
        records=tuple(sorted(records, key=lambda r: (not r.warmup, r.index))),
        samples=tuple(samples),
        timed_out=timed_out,
        load_average=(load_at_start, os.getloadavg()[0]),
    )


async def _send_all(
    target: Target,
    prompts: Sequence[Prompt],
    settings: LoadSettings,
    run_start_s: float,
    records: list[RequestRecord],
    progress: Progress,
    warmup: bool,
) -> None:
    limiter = trio.CapacityLimiter(settings.max_concurrency)
    offsets = arrival_offsets_s(
        len(prompts), settings.request_rate, settings.burstiness, settings.seed
    )
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for prompt, offset_s in zip(prompts, offsets, strict=True):
            args = (target, prompt, start + offset_s, limiter, settings, run_start_s)
            nursery.start_soon(_one, *args, records, progress, warmup)


async def _one(
    target: Target,
    prompt: Prompt,
    send_at: float,
    limiter: trio.CapacityLimiter,
    settings: LoadSettings,
    run_start_s: float,
    records: list[RequestRecord],
    progress: Progress,
    warmup: bool,
) -> None:
    await trio.sleep_until(send_at)
    async with limiter:
        timeline = Timeline(read_speed=settings.read_speed)
        num_refusals = 0
        refused_after_s: float | None = None
        attempt_s = timeline.sent_s
        outcome = "failed"
        error: str | None = "time limit reached"
        try:
            while True:
                attempt_s = time.perf_counter() if num_refusals else timeline.sent_s
                try:
                    await target.request(prompt, timeline)
                except Refused as refusal:
                    num_refusals += 1
                    if refused_after_s is None:
                        refused_after_s = time.perf_counter() - timeline.sent_s
                    if not settings.retry:
                        outcome, error = "refused", "refused (not retried)"
                        break
                    await trio.sleep(retry_delay_s(refusal, settings))
                    continue
                except TargetError as exc:
                    outcome, error = "failed", str(exc)
                else:
                    outcome, error = "completed", None
                break
        finally:
            if outcome == "failed" and error == "time limit reached" and num_refusals:
                outcome = "refused"
            done_s = time.perf_counter() - timeline.sent_s
            records.append(
                RequestRecord(
                    index=prompt.index,
                    wave=0,  # set from the send order once all are in
                    sent_at_s=timeline.sent_s - run_start_s,
                    outcome=outcome,
                    text_at_s=tuple(timeline.text_at_s),
                    audio=tuple(timeline.audio),
                    done_at_s=done_s if outcome == "completed" else None,
                    error=error,
                    num_input_words=prompt.num_words,
                    num_refusals=num_refusals,
                    refused_after_s=refused_after_s,
                    admitted_at_s=max(0.0, attempt_s - timeline.sent_s),
                    warmup=warmup,
                )
            )
            progress.update(failed=outcome != "completed")


async def _sample_forever(
    target: Target, settings: LoadSettings, run_start_s: float, samples: list[Sample]
) -> None:
    while True:
        sample = await target.sample()
        if sample is not None:
            at_s = time.perf_counter() - run_start_s
            samples.append(dataclasses.replace(sample, at_s=at_s))
        await trio.sleep(settings.sample_interval_s)
