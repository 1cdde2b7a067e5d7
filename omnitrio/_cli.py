"""The ``omnitrio`` command line.

``omnitrio run`` serves the default pipeline (or ``--config``) over HTTP and
WebSocket with the voice-chat page; ``omnitrio prompt`` runs prompts through a
pipeline in-process and prints what each stream produces and a statistics
summary; ``omnitrio bench`` measures a pipeline or a server against baselines
(the harness is the repository's ``benchmarks`` package, apart from the runtime: this
module hands it what follows ``bench`` and imports it only then); ``omnitrio
check-config`` validates a config file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import signal
import socket
import sys
import types
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ._config import PipelineConfig, load_config
from ._errors import ConfigError, OmnitrioError
from ._families import tiny_model_builder, tiny_model_builders
from ._items import AudioChunk, Event, TextDelta
from ._listen import listen_socket
from ._overrides import MODEL_PATH_HELP, with_model_path_arg, with_ray_address
from ._pipeline import Pipeline, open_pipeline

if TYPE_CHECKING:
    from .server import ServerSettings

# The repository's pipelines (found from a checkout's editable install too): `run` serves
# the offline voice chat by default; `prompt`, a quick in-process check, runs the
# synthetic pipeline, which needs no model packages.
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIGS / "voice-chat.yaml"
DEFAULT_FAMILY = "qwen3-omni"  # make-tiny-model and split-checkpoint without --family
DEFAULT_PROMPT_CONFIG = CONFIGS / "synthetic.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)  # `bench`'s arguments are the harness's
    if rest and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "check-config":
            config = load_config(args.config)
            print(f"{args.config}: ok ({' -> '.join(s.name for s in config.stages)})")
            return 0
        if args.command == "run":
            return _serve(args)
        if args.command == "make-tiny-model":
            return _make_tiny_model(args)
        if args.command == "split-checkpoint":
            return _split_checkpoint(args)
        if args.command == "bench":
            harness = _bench_harness()
            if harness is None:
                return 2
            args = harness.parse_args(rest)
            job = harness.bench
        else:
            job = _prompt
        signum = trio.run(_until_signal, job, args)
        if signum is not None:
            print(f"omnitrio: {signal.Signals(signum).name}; pipeline stopped", file=sys.stderr)
            return 128 + signum
    except BaseException as exc:  # sorted below; anything unexpected re-raises
        leaves = list(_leaves(exc))
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            print("omnitrio: interrupted; pipeline stopped", file=sys.stderr)
            return 130
        if not all(isinstance(e, OmnitrioError | ValueError | OSError) for e in leaves):
            raise
        for error in leaves:
            for line in str(error).splitlines() or [type(error).__name__]:
                print(f"omnitrio: {line}", file=sys.stderr)
            if isinstance(error, ConfigError) and error.also:
                print(
                    f"omnitrio: {1 + len(error.also)} problems in {error.source}", file=sys.stderr
                )
        return 2
    return 0


def _checkout_on_path() -> None:
    """Put the checkout's root on the import path when omnitrio runs from one (an editable
    install): the harness lives in its ``benchmarks/`` folder, which the wheel leaves out."""
    root = Path(__file__).resolve().parents[1]
    if (root / "benchmarks" / "harness" / "cli.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))


def _bench_harness() -> types.ModuleType | None:
    """The benchmark harness (``benchmarks/harness/cli.py``), or None, having said on
    stderr what is missing: the ``benchmarks`` package (it ships with the repository,
    not apart from it) or one of the harness's own dependencies."""
    _checkout_on_path()
    try:
        from benchmarks.harness import cli
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing.split(".")[0] == "benchmarks":
            print(
                f"omnitrio: bench needs the benchmark harness, the `benchmarks` folder of "
                f"omnitrio's repository, and {missing!r} is not importable here: run it "
                "from an install made from a checkout of the repository (scripts/setup)",
                file=sys.stderr,
            )
        else:
            print(
                f"omnitrio: bench needs {missing!r}, which is not installed: "
                "pip install 'omnitrio[bench]'",
                file=sys.stderr,
            )
        return None
    return cli


def _serve(args: argparse.Namespace) -> int:
    # Bind first, before the web stack and the config (whose stage modules it imports).
    with listen_socket(args.host, args.port) as sock:
        from .server import ServerSettings  # the web stack loads only for the server

        settings = ServerSettings.from_env(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            allowed_origins=tuple(args.allow_origin or ()),
            grace_period_s=args.grace_period_s,
            max_streams_per_client=args.max_streams_per_client,
            max_connections_per_client=args.max_connections_per_client,
            **_client_totals(args),
        )
        config = _configured(args)
        return _serve_on(config, settings, sock)


def _client_totals(args: argparse.Namespace) -> dict[str, object]:
    """The per-client totals' flags that were given (the settings' defaults otherwise)."""
    given = {
        "max_sessions_per_key": args.max_sessions_per_key,
        "max_client_held_bytes": args.max_client_held_bytes,
        "decode_timeout_s": args.decode_timeout_s,
    }
    return {name: value for name, value in given.items() if value is not None}


def _serve_on(config: PipelineConfig, settings: ServerSettings, sock: socket.socket) -> int:
    from .server import serve

    async def run() -> int | None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, config, settings, sockets=[sock]))
            if not binds:
                return None  # stopped by a signal while the stages loaded
            stages = " -> ".join(s.name for s in config.stages)
            print(f"omnitrio serving {config.pipeline.name} ({stages}) at {', '.join(binds)}")
            realtime = "ws" + binds[0].removeprefix("http")  # https -> wss
            print(f"  voice chat page: {binds[0]}/   realtime: {realtime}/v1/realtime", flush=True)
        return None

    # ``serve`` takes SIGINT/SIGTERM over while it runs (a second one ends the grace
    # period). Outside it they are ignored, so one that comes after the server stopped
    # cannot kill the interpreter's teardown (about a second) and turn exit 0 into 143.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    trio.run(run)
    print("omnitrio: stopped", file=sys.stderr)
    return 0


def _configured(args: argparse.Namespace) -> PipelineConfig:
    """The config of ``--config`` with ``--model-path`` and ``--ray-address`` applied."""
    config = load_config(args.config)
    for value in args.model_path or ():
        config = with_model_path_arg(config, value)
    if args.ray_address is not None:
        config = with_ray_address(config, args.ray_address)
    return config


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


# What --help shows: plain text (the module docstring is for readers of the code).
DESCRIPTION = (
    "omnitrio: streaming speech and omni-model pipelines on trio. Serve one over HTTP and "
    "WebSocket with a voice-chat page, run prompts through one, measure one, check a config."
)
EXAMPLES = """examples:
  omnitrio run                                  serve the voice chat, http://127.0.0.1:8000
  omnitrio run --config configs/synthetic.yaml  serve the synthetic pipeline (no models)
  omnitrio prompt --prompt hello --streams 4    run prompts in-process; print the output
  omnitrio check-config FILE                    list every problem in a pipeline config
  omnitrio COMMAND --help                       a command's options"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omnitrio",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--version", action="version", version=f"omnitrio {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="serve a pipeline: OpenAI-compatible HTTP, Realtime WebSocket, voice page"
    )
    run.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="pipeline YAML (default configs/voice-chat.yaml)",
    )
    run.add_argument(
        "--model-path", action="append", metavar="DIR | STAGE=PATH", help=MODEL_PATH_HELP
    )
    run.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks one)")
    run.add_argument(
        "--api-key", help="require this key (or set OMNITRIO_API_KEY); needed off loopback"
    )
    run.add_argument(
        "--allow-origin", action="append", help="another browser origin to allow (repeatable)"
    )
    run.add_argument(
        "--grace-period-s", type=float, default=2.0, help="on SIGINT/SIGTERM, time to finish"
    )
    run.add_argument(
        "--max-streams-per-client",
        type=int,
        help="streams one client (connection address) may hold; default half of max_streams",
    )
    run.add_argument(
        "--max-connections-per-client",
        type=int,
        help="connections one client (address) may hold; default 1/16 of max_connections, >= 8",
    )
    run.add_argument(
        "--max-sessions-per-key",
        type=int,
        help="Realtime sessions open at once with one API key; default: not counted by key",
    )
    run.add_argument(
        "--max-client-held-bytes",
        type=int,
        help="input one client's Realtime sessions may hold together (default 32 MiB)",
    )
    run.add_argument(
        "--decode-timeout-s",
        type=float,
        help="an uploaded audio file's decode is stopped past this (default 20 s)",
    )
    prompt = commands.add_parser("prompt", help="run a pipeline on prompts and print its output")
    prompt.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_PROMPT_CONFIG,
        help="pipeline YAML (default configs/synthetic.yaml)",
    )
    prompt.add_argument("--prompt", action="append", help="a prompt (repeat for several streams)")
    prompt.add_argument("--streams", type=int, default=1, help="concurrent copies of each prompt")
    prompt.add_argument(
        "--model-path", action="append", metavar="DIR | STAGE=PATH", help=MODEL_PATH_HELP
    )
    for command in (run, prompt):
        command.add_argument(
            "--ray-address",
            help="the Ray cluster for stages with placement: ray (default: pipeline.ray_address,"
            " else a local Ray instance started with the pipeline)",
        )
    # Its arguments are the harness's (benchmarks/harness/_args.py), parsed when it runs:
    # `omnitrio bench --help` lists them.
    commands.add_parser(
        "bench",
        help="benchmark a pipeline or server against baselines (streaming metrics)",
        add_help=False,
    )
    check = commands.add_parser(
        "check-config", help="validate a pipeline config and name every problem in it"
    )
    check.add_argument("config", type=Path)
    families = sorted(tiny_model_builders())  # each model family registers its builder
    tiny = commands.add_parser(
        "make-tiny-model", help="write a tiny random-init checkpoint (for tests and demos)"
    )
    tiny.add_argument("directory", type=Path)
    tiny.add_argument("--family", choices=families, default=DEFAULT_FAMILY)
    tiny.add_argument("--seed", type=int, default=0, help="random-init seed (default 0)")
    split = commands.add_parser(
        "split-checkpoint", help="split a published checkpoint into one folder per stage"
    )
    split.add_argument("source", type=Path, help="the composite checkpoint folder")
    split.add_argument("destination", type=Path, help="where thinker/, talker/, ... go")
    split.add_argument("--family", choices=families, default=DEFAULT_FAMILY)
    for command in commands.choices.values():  # after the subcommand too; it wins there
        command.add_argument("--log-level", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("omnitrio")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _make_tiny_model(args: argparse.Namespace) -> int:
    tiny_model_builder(args.family).make_tiny_checkpoint(args.directory, seed=args.seed)
    print(f"omnitrio: wrote a tiny {args.family} checkpoint to {args.directory}")
    return 0


def _split_checkpoint(args: argparse.Namespace) -> int:
    if not (args.source / "config.json").is_file():
        raise ConfigError(str(args.source), "source", "no config.json: not a checkpoint folder")
    split = getattr(tiny_model_builder(args.family), "split_checkpoint", None)
    if split is None:
        raise ConfigError(args.family, "--family", "this family has no split step; serve as is")
    split(args.source, args.destination)
    print(f"omnitrio: wrote the stages of {args.source} to {args.destination}")
    return 0


async def _until_signal(
    job: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace
) -> int | None:
    """Run ``job`` until done or until SIGINT/SIGTERM; returns the signal that stopped it.

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
            await job(args)
            nursery.cancel_scope.cancel()
    return stopped_by


async def _prompt(args: argparse.Namespace) -> None:
    prompts = [p for p in (args.prompt or ["Hello, omnitrio!"]) for _ in range(args.streams)]
    config = _configured(args)
    async with open_pipeline(config) as pipeline:
        stages = " -> ".join(s.name for s in pipeline.config.stages)
        print(f"pipeline {pipeline.config.pipeline.name!r} ready: {stages}", flush=True)
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
