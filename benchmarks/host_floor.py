"""What this host charges for the first audio's hand-offs, with no omnitrio in the way.

Usage (from the repository root)::

    python -m benchmarks.host_floor [--requests 30] [--tokens 32] [--crossings 200]
                                    [--config configs/bench-omni.yaml] [--json out.json]

``omnitrio bench``'s *runtime-added TTFA* is the first audio's time less the stages' own
(``ideal_first_audio_s``). At one stream on ``configs/bench-omni.yaml`` the path to the
first audio is six steps (the thinker's four, the prefill in the first; the talker's
fourth frame; code2wav's fourth window, the first audio) and six wake-ups of a blocked
thread: the thinker's thread taking the request, trio woken by the thinker's fourth
result, the talker's thread, trio, code2wav's thread, trio (which then runs the client's
task). omnitrio cannot do with fewer while it plans on one trio thread and steps each
stage on a thread of its own (``docs/design.md``).

This script builds that shape with nothing else: three threads, each blocked on a
``queue.SimpleQueue`` of jobs, each posting every step's end back with
``run_sync_soon`` (as ``omnitrio._worker`` does), and trio callbacks that route a
thinker token to the talker and a talker frame to code2wav, with no planning, links,
admission or batches. Steps end at their deadline as ``stages.synthetic`` ends them
(a sleep to ``SLEEP_MARGIN_S`` before, then GIL-releasing polls of the clock). A
closed loop of one client sends ``--requests`` requests of ``--tokens`` tokens, each
as the last one ends, as ``omnitrio bench --sweep 1`` does. What it reports:

- ``added``: first audio (the client's task running) less the ideal, per request: the
  floor of the runtime-added TTFA for a thread-per-stage design on trio on this host;
- ``steps late``: how late the path's six steps ended, summed per request (their
  deadline waits; the rest of ``added`` is the hand-offs);
- ``crossing``: one no-work job from trio to an idle thread (idle ``--idle-ms``) and
  back, as a single hand-off costs; ``sleep late``: a bare ``time.sleep`` of the
  shortest path step, how late it wakes;
- two tracers of the host's speed, for comparing hosts: ``python 1k adds``, a loop of
  1,000 additions in the interpreter, and ``select(0)``, one zero-timeout
  ``select.select`` (a system call that releases the GIL, as the steps' polls do).

All figures are in microseconds.
"""

from __future__ import annotations

import argparse
import json
import queue
import select
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from omnitrio import PipelineConfig, load_config

from .harness._profile import StageProfile, ideal_first_audio_s, synthetic_profiles

SLEEP_MARGIN_S = 0.2e-3  # stages.synthetic's: the deadline's last part is polled
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "bench-omni.yaml"
WINDOW = 4  # code2wav's visible_every on the path: its fourth step is the first audio
Step = Callable[[int, float], None]  # a step's end on the trio thread: its index, lateness
Job = tuple[Sequence[float], Step]


@dataclass(frozen=True)
class PathShape:
    """The three stages' step lengths at one stream (s) and the ideal first audio."""

    thinker_first_s: float  # the prefill and the first token
    thinker_s: float
    talker_s: float
    code2wav_s: float
    ideal_s: float

    def path_s(self) -> float:
        """The six path steps end to end: what the ideal must equal on this shape."""
        return (
            self.thinker_first_s + (WINDOW - 1) * self.thinker_s + self.talker_s + self.code2wav_s
        )


def path_shape(config: PipelineConfig, num_words: int, tokens: int) -> PathShape:
    """The shape of ``config`` at one stream; it must be the bench's three-stage chain
    (a source, a stage of one unit per input, a stage whose ``WINDOW``-th unit is audio)."""
    profiles = synthetic_profiles(config)
    if profiles is None or len(profiles) != 3:
        raise ValueError("host_floor needs a chain of three synthetic stages")
    thinker, talker, code2wav = profiles
    if not _one_per_input(talker) or not _one_per_input(code2wav):
        raise ValueError("the talker and code2wav must step once per input")
    if code2wav.visible_every != WINDOW or code2wav.audio_s_per_visible is None:
        raise ValueError(f"code2wav's every {WINDOW}th unit must be audio")
    ideal = ideal_first_audio_s(profiles, tokens, num_words)
    if ideal is None:
        raise ValueError("no audio within the answer's tokens")
    prefill = thinker.prefill_s + thinker.prefill_per_word_s * num_words
    return PathShape(
        thinker_first_s=prefill + thinker.step_cost_s(1),
        thinker_s=thinker.step_cost_s(1),
        talker_s=talker.step_cost_s(1),
        code2wav_s=code2wav.step_cost_s(1),
        ideal_s=ideal,
    )


def _one_per_input(stage: StageProfile) -> bool:
    return (
        stage.frames_per_input is None
        and stage.window is None
        and stage.replicas == 1
        and stage.host_s == 0
    )


def wait_until(deadline_s: float) -> float:
    """``stages.synthetic``'s deadline wait; returns how late it returned (s)."""
    coarse_s = deadline_s - time.perf_counter() - SLEEP_MARGIN_S
    if coarse_s > 0:
        time.sleep(coarse_s)
    while time.perf_counter() < deadline_s:
        select.select([], [], [], 0)
    return time.perf_counter() - deadline_s


class StageThread:
    """A thread blocked on its job queue; a job is a list of step lengths, each step's
    end posted to trio with ``run_sync_soon`` (its index and how late it ended)."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._token = token
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, steps: Sequence[float], done: Step) -> None:
        self._jobs.put((steps, done))

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            steps, done = job
            for index, length_s in enumerate(steps):
                late = wait_until(time.perf_counter() + length_s)
                self._token.run_sync_soon(done, index, late)


@dataclass
class Request:
    """One request's times on the trio thread (perf_counter s)."""

    sent_s: float
    first_audio_s: float = 0.0
    path_late_s: float = 0.0
    frames: int = 0
    windows: int = 0


async def run_path(shape: PathShape, requests: int, tokens: int) -> list[Request]:
    """The closed loop of one client over the three threads; every request's times."""
    token = trio.lowlevel.current_trio_token()
    stages = [StageThread(n, token) for n in ("thinker", "talker", "code2wav")]
    thinker, talker, code2wav = stages
    done: list[Request] = []
    try:
        for _ in range(requests):
            first_audio, ended = trio.Event(), trio.Event()
            request = Request(sent_s=time.perf_counter())

            def on_window(
                _: int,
                late: float,
                r: Request = request,
                first: trio.Event = first_audio,
                last: trio.Event = ended,
            ) -> None:
                r.windows += 1
                if r.windows == WINDOW:
                    r.path_late_s += late
                    first.set()
                if r.windows == tokens:
                    last.set()

            def on_frame(
                _: int, late: float, r: Request = request, window: Step = on_window
            ) -> None:
                r.frames += 1
                if r.frames == WINDOW:
                    r.path_late_s += late
                code2wav.submit([shape.code2wav_s], window)

            def on_token(
                index: int, late: float, r: Request = request, frame: Step = on_frame
            ) -> None:
                if index < WINDOW:
                    r.path_late_s += late
                talker.submit([shape.talker_s], frame)

            steps = [shape.thinker_first_s] + [shape.thinker_s] * (tokens - 1)
            thinker.submit(steps, on_token)
            await first_audio.wait()
            request.first_audio_s = time.perf_counter()
            await ended.wait()
            done.append(request)
    finally:
        for stage in stages:
            stage.stop()
    return done


async def crossings(count: int, idle_s: float) -> list[float]:
    """Round trips of a no-work job to a thread idle ``idle_s`` before each (s)."""
    token = trio.lowlevel.current_trio_token()
    worker = StageThread("crossing", token)
    times: list[float] = []
    try:
        for _ in range(count):
            await trio.sleep(idle_s)
            back = trio.Event()
            sent = time.perf_counter()
            worker.submit([0.0], lambda _i, _l, woken=back: woken.set())
            await back.wait()
            times.append(time.perf_counter() - sent)
    finally:
        worker.stop()
    return times


def python_adds(count: int) -> list[float]:
    """How long the interpreter takes for a loop of 1,000 additions (s), ``count`` times."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        total = 0
        for i in range(1000):
            total += i
        times.append(time.perf_counter() - start)
    return times


def zero_selects(count: int) -> list[float]:
    """One zero-timeout ``select.select`` each (s), ``count`` times."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        select.select([], [], [], 0)
        times.append(time.perf_counter() - start)
    return times


def sleep_late(length_s: float, count: int) -> list[float]:
    """How late a bare ``time.sleep(length_s)`` returns (s), on this thread."""
    late = []
    for _ in range(count):
        start = time.perf_counter()
        time.sleep(length_s)
        late.append(time.perf_counter() - start - length_s)
    return late


@dataclass(frozen=True)
class Summary:
    """Percentiles in microseconds."""

    n: int
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Summary:
        us = sorted(s * 1e6 for s in seconds)
        cuts = statistics.quantiles(us, n=100, method="inclusive") if len(us) > 1 else us * 99
        return cls(len(us), round(cuts[49], 1), round(cuts[89], 1), round(cuts[98], 1))


def measure(args: argparse.Namespace) -> dict[str, Summary]:
    shape = path_shape(load_config(args.config), args.input_len, args.tokens)
    if abs(shape.path_s() - shape.ideal_s) > 1e-9:
        raise ValueError(f"the path's steps ({shape.path_s()}) are not the ideal ({shape.ideal_s})")
    requests = trio.run(run_path, shape, args.requests + 1, args.tokens)[1:]  # one warm-up
    added = [r.first_audio_s - r.sent_s - shape.ideal_s for r in requests]
    late = [r.path_late_s for r in requests]
    return {
        "added": Summary.of(added),
        "steps late": Summary.of(late),
        "hand-offs": Summary.of([a - s for a, s in zip(added, late, strict=True)]),
        "crossing": Summary.of(trio.run(crossings, args.crossings, args.idle_ms / 1000)),
        "sleep late": Summary.of(sleep_late(shape.code2wav_s, args.crossings)),
        "python 1k adds": Summary.of(python_adds(args.crossings)),
        "select(0)": Summary.of(zero_selects(args.crossings)),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--requests", type=int, default=30, help="measured, after one warm-up")
    parser.add_argument("--tokens", type=int, default=32, help="text tokens per answer")
    parser.add_argument("--input-len", type=int, default=32, help="words per prompt")
    parser.add_argument("--crossings", type=int, default=200)
    parser.add_argument("--idle-ms", type=float, default=5.0, help="before each crossing")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.tokens < WINDOW:
        parser.error(f"--tokens must be at least {WINDOW}")
    results = measure(args)
    print("| what | n | p50 us | p90 us | p99 us |\n|---|---|---|---|---|")
    for name, s in results.items():
        print(f"| {name} | {s.n} | {s.p50:.1f} | {s.p90:.1f} | {s.p99:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({k: asdict(v) for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
