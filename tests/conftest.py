"""Shared helpers: synthetic pipelines built in code, and leak checks."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

import omnitrio

SYNTHETIC = "stages.synthetic:SyntheticStage"
REPO = Path(__file__).resolve().parent.parent

# The leak check below counts threads, so the model libraries' own long-lived helper
# threads are turned off for the whole run, whichever test loads a model first:
# transformers' background weight loading, and tqdm's progress-bar monitor.
os.environ.setdefault("HF_DEACTIVATE_ASYNC_LOAD", "1")
try:
    import tqdm
except ImportError:  # the model extras are not installed
    pass
else:
    tqdm.tqdm.monitor_interval = 0


def chain_config(
    stage_params: Sequence[dict[str, Any]],
    *,
    edge_capacity: int = 4,
    client_capacity: int = 4,
    max_streams: int = 8,
    max_batch_size: int = 8,
    shutdown_timeout_s: float = 2.0,
    impls: Sequence[str] | None = None,
    placement: str = "thread",
) -> omnitrio.PipelineConfig:
    """A chain of stages named a, b, c, ... (synthetic unless ``impls`` says otherwise),
    every one with ``placement`` (thread, or ray: see the ``placement`` fixture)."""
    names = [chr(ord("a") + i) for i in range(len(stage_params))]
    return omnitrio.parse_config(
        {
            "pipeline": {
                "name": "test",
                "max_streams": max_streams,
                "client_capacity": client_capacity,
                "shutdown_timeout_s": shutdown_timeout_s,
            },
            "stages": [
                {
                    "name": name,
                    "impl": impls[i] if impls else SYNTHETIC,
                    "max_batch_size": max_batch_size,
                    "params": params,
                    "placement": placement,
                }
                for i, (name, params) in enumerate(zip(names, stage_params, strict=True))
            ],
            "edges": [
                {"from": a, "to": b, "capacity": edge_capacity}
                for a, b in itertools.pairwise(names)
            ],
        }
    )


@dataclass(frozen=True)
class Stopped:
    returncode: int
    stderr: str
    exit_s: float
    """From the signal to the process's exit."""


def prompt_until_signal(
    config: Path,
    signum: signal.Signals,
    *,
    env: Mapping[str, str] | None = None,
    when_ready: Callable[[], None] = lambda: None,
) -> Stopped:
    """Run ``omnitrio prompt`` on ``config`` (8 streams) in a child process until its
    pipeline is ready, call ``when_ready``, send ``signum`` and wait (60 s at most)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "omnitrio._cli",
            "prompt",
            "--config",
            str(config),
            "--streams",
            "8",
        ],
        cwd=REPO,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        first = process.stdout.readline()  # blocks until the pipeline is up
        if "ready" not in first:
            _, err = process.communicate(timeout=60)
            raise AssertionError(f"no 'ready' line (got {first!r}); stderr:\n{err}")
        when_ready()
        process.send_signal(signum)
        started = time.monotonic()
        _, err = process.communicate(timeout=60)
        return Stopped(process.returncode, err, time.monotonic() - started)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("omnitrio-stage-")]


def count_tasks() -> int:
    """Every task in this trio run, found by walking the task tree from the root."""

    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(walk(c) for n in task.child_nurseries for c in n.child_tasks)

    return walk(trio.lowlevel.current_root_task())


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local two-node Ray cluster for the whole test session (Ray takes seconds to
    start): the head, with the custom resource ``node_a``, and a second node with
    ``node_b``. This
    process stays connected to it, so pipelines with ``placement: ray`` use it and
    leave it running (``open_ray``)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"node_a": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(params=["thread", "ray"])
def placement(request: pytest.FixtureRequest) -> str:
    """Run the test with every stage on a thread, then with every stage on Ray."""
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return str(request.param)


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def chromium() -> Path:
    """Debian's chromium, for the browser tests (scripts/check installs it as root)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing; install Debian's chromium (scripts/check does)")
    return CHROMIUM


@pytest.fixture(scope="session")
def voice_weights() -> None:
    """The LLM's weights cache, converted before any voice server starts: a first
    conversion (~20 s) would not fit in the servers' start timeouts."""
    from stages.voice.llm_weights import ensure_converted

    ensure_converted(None)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every test must leave no stage worker thread behind (nor any other of ours)."""
    before = _our_threads()
    yield
    assert stage_threads() == []
    assert _our_threads() <= before


# The session's Ray connection (``ray_cluster``) keeps these for its lifetime: not ours.
RAY_DRIVER_THREADS = frozenset({"PythonGCThread", "ray_listen_error_messages", "ray_print_logs"})


def _our_threads() -> int:
    # trio.to_thread's cache keeps idle "Trio thread N" workers for a while: not ours.
    return sum(
        1
        for t in threading.enumerate()
        if not t.name.startswith("Trio thread") and t.name not in RAY_DRIVER_THREADS
    )


async def collect(stream: omnitrio.Stream) -> list[omnitrio.VisibleItem]:
    return [item async for item in stream]


def texts(items: Sequence[omnitrio.VisibleItem]) -> list[str]:
    return [i.text for i in items if isinstance(i, omnitrio.TextDelta)]


class Announced:
    """A ``trio.Event`` set when the runtime logs a message containing ``text`` for
    stage ``stage`` (its log records carry ``extra={"stage": ...}`` or name it): what
    a test waits on for a change the runtime only announces, e.g. "is back" after a
    hung step returned or a Ray actor was restarted. Use as a context manager, entered
    before the change can happen; it sets the event from whichever thread logs."""

    def __init__(self, stage: str, text: str) -> None:
        self.event = trio.Event()
        self._stage = stage
        self._text = text
        self._token = trio.lowlevel.current_trio_token()
        self._handler = logging.Handler()
        self._handler.emit = self._emit  # type: ignore[method-assign]

    def _emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        named = getattr(record, "stage", None) == self._stage or repr(self._stage) in message
        if named and self._text in message:
            self._token.run_sync_soon(self.event.set)

    def __enter__(self) -> trio.Event:
        logging.getLogger("omnitrio").addHandler(self._handler)
        return self.event

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("omnitrio").removeHandler(self._handler)


async def wait_until_exited(pid: int) -> None:
    """Until process ``pid`` (any process, not only a child) has exited: its pidfd
    becomes readable then (Linux 5.3+). No polling."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def serve_chain(
    nursery: trio.Nursery, stages: list[dict[str, object]], max_streams: int, **settings: object
) -> int:
    """A real server on loopback over ``chain_config(stages)``; its port."""
    from omnitrio.server import ServerSettings, serve

    config = chain_config(stages, max_streams=max_streams)
    binds = await nursery.start(serve, config, ServerSettings(port=0, **settings))  # type: ignore[arg-type]
    return int(str(binds[0]).rsplit(":", 1)[1])


def distinct_tools(count: int, tag: str) -> list[dict[str, Any]]:
    """``count`` distinct function tools of a chat request (a fresh ``tag`` defeats the
    server's cache of checked tools); shared by tests/server/test_isolation.py and
    benchmarks/reliability/isolation_attacks.py."""
    schema = {"type": "object", "properties": {"x": {"type": "string", "enum": ["a", "b"]}}}
    return [
        {"type": "function", "function": {"name": f"f{tag}_{i}", "parameters": schema}}
        for i in range(count)
    ]


def realtime_tool_rounds(tag: str) -> list[list[dict[str, Any]]]:
    """The Realtime tools flood's nine ``session.update`` tool lists: 6,500 tools (as
    many as a frame's values allow, 3 a tool), then 8 x 128 fresh ones; shared by
    tests/server/test_isolation.py and benchmarks/reliability/isolation_attacks.py."""
    rounds = [[{"type": "function", "name": f"f{i}"} for i in range(6_500)]]
    for n in range(1, 9):
        rounds.append(
            [{"type": "function", **t["function"]} for t in distinct_tools(128, f"{tag}{n}")]
        )
    return rounds


def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request from ``source`` on its own connection, read to its end
    (a raw socket: what a client library would not send; shared by the server tests)."""
    head = {"Host": "127.0.0.1", "Content-Length": str(len(body))} | (headers or {})
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        with s.makefile("rb") as reader:
            status = int(reader.readline().split()[1])
            fields: dict[str, str] = {}
            while (line := reader.readline().strip()) != b"":
                name, _, value = line.decode().partition(":")
                fields[name.lower()] = value.strip()
            if "content-length" in fields:
                return status, fields, reader.read(int(fields["content-length"]))
            data = b""  # chunked
            while (size := int(reader.readline().split(b";")[0], 16)) != 0:
                data += reader.read(size)
                reader.readline()
            return status, fields, data


# Issue 27 #8's Realtime events, for tests/server/test_isolation.py and the attack kit:
# 48 KB of "1,2," inside one string (a pre-check once counted its commas as values),
# and a truncate whose audio_end_ms is far past any audio.
COMMAS_ITEM = {
    "type": "conversation.item.create",
    "item": {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "1,2," * 12_000}],
    },
}
HUGE_TRUNCATE = {
    "type": "conversation.item.truncate",
    "item_id": "x",
    "content_index": 0,
    "audio_end_ms": 1e308,
}
