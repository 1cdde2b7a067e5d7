"""The ``omnitrio`` command line.

``omnitrio run`` starts the default pipeline (or ``--config``), sends the given
prompts as concurrent streams, prints what each stream produces as it arrives
and a statistics summary. ``omnitrio check-config`` validates a config file.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import trio

from ._config import load_config
from ._errors import OmnitrioError
from ._items import AudioChunk, Event, TextDelta
from ._pipeline import Pipeline, open_pipeline

# The repository's default pipeline (found from a checkout's editable install too).
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "synthetic.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "check-config":
            config = load_config(args.config)
            print(f"{args.config}: ok ({' -> '.join(s.name for s in config.stages)})")
            return 0
        signum = trio.run(_run_until_signal, args)
        if signum is not None:
            print(f"omnitrio: {signal.Signals(signum).name}; pipeline stopped", file=sys.stderr)
            return 128 + signum
    except BaseException as exc:  # sorted below; anything unexpected re-raises
        leaves = list(_leaves(exc))
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            print("omnitrio: interrupted; pipeline stopped", file=sys.stderr)
            return 130
        if not all(isinstance(e, OmnitrioError) for e in leaves):
            raise
        for error in leaves:
            print(f"omnitrio: {error}", file=sys.stderr)
        return 2
    return 0


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnitrio", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a pipeline on prompts and print its output")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="pipeline YAML")
    run.add_argument("--prompt", action="append", help="a prompt (repeat for several streams)")
    run.add_argument("--streams", type=int, default=1, help="concurrent copies of each prompt")
    check = commands.add_parser("check-config", help="validate a pipeline config")
    check.add_argument("config", type=Path)
    return parser


async def _run_until_signal(args: argparse.Namespace) -> int | None:
    """Run until done or until SIGINT/SIGTERM; returns the signal that stopped it.

    Signals become a cancellation of the run (a clean shutdown through every
    ``finally``), not a KeyboardInterrupt landing at an arbitrary line.
    """
    stopped_by: int | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                nonlocal stopped_by
                async for signum in signals:
                    stopped_by = signum
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            await _run(args)
            nursery.cancel_scope.cancel()
    return stopped_by


async def _run(args: argparse.Namespace) -> None:
    prompts = [p for p in (args.prompt or ["Hello, omnitrio!"]) for _ in range(args.streams)]
    async with open_pipeline(args.config) as pipeline:
        stages = " -> ".join(s.name for s in pipeline.config.stages)
        print(f"pipeline {pipeline.config.pipeline.name!r} ready: {stages}")
        async with trio.open_nursery() as nursery:
            for index, prompt in enumerate(prompts):
                nursery.start_soon(_one_stream, pipeline, index, prompt)
        _print_statistics(pipeline)


async def _one_stream(pipeline: Pipeline, index: int, prompt: str) -> None:
    audio_s = 0.0
    text: list[str] = []
    async with pipeline.open_stream(prompt) as stream:
        try:
            async for item in stream:
                if isinstance(item, TextDelta):
                    text.append(item.text)
                elif isinstance(item, AudioChunk):
                    audio_s += item.duration_s
                elif isinstance(item, Event):
                    print(f"[{index}] event {item.name}: {dict(item.data)}")
        except OmnitrioError as exc:
            print(f"[{index}] failed: {exc}")
            return
    print(f"[{index}] text: {''.join(text).strip()!r}  audio: {audio_s:.2f} s")


def _print_statistics(pipeline: Pipeline) -> None:
    stats = pipeline.statistics()
    print(
        f"streams: {stats.num_completed} completed, {stats.num_failed} failed, "
        f"{stats.num_cancelled} cancelled; payloads routed stage to stage: "
        f"{stats.num_payloads_routed}; items delivered: {stats.num_items_delivered}"
    )
    for stage in stats.stages.values():
        print(
            f"  {stage.name}: {stage.num_steps} steps, mean batch {stage.mean_batch_size:.1f}, "
            f"busy {stage.busy_s:.3f} s, idle {stage.idle_s:.3f} s"
        )


if __name__ == "__main__":
    raise SystemExit(main())
