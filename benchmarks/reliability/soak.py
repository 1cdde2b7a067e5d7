#!/usr/bin/env python
"""Soak test: the real server, many concurrent Realtime conversations with churn, then leak checks.

Starts ``omnitrio run`` as a subprocess on a synthetic pipeline (loopback, a port
picked by the OS) and runs ``--conversations`` concurrent conversation loops for
``--minutes`` over the Realtime WebSocket API (JSON framing). Each loop picks
every turn with its own seeded RNG:

- ``normal``: a text (or committed-audio) turn read to ``response.done``;
- ``cancel``: ``response.cancel`` after a random number of audio deltas;
- ``disconnect``: the socket is closed mid-audio without a close frame (FIN, or
  RST via ``SO_LINGER`` 0); the loop reconnects for its next turn;
- ``slow``: the reader sleeps after every audio delta, slower than real time
  (but well inside the server's ``send_timeout_s``), and must still get it all.

Some loops also open a fresh connection every few turns. Every turn ends in
exactly one outcome: completed, cancelled, cancel_too_late (the response ended
before the cancel arrived; the server answers ``response_cancel_not_active``),
disconnected (by us) or failed with a reason. Turns are reconciled with the
server: its per-response log line (status by response id), its pipeline stream
totals and its connection counter.

Every ``--sample-s`` the server is sampled: ``GET /metrics`` (open streams,
streams by outcome) and ``/proc/<pid>`` (VmRSS, Threads, open fds), plus the
number of live trio tasks (a ``sitecustomize`` on the server's ``PYTHONPATH``
adds a trio instrument and one reporter thread; ``--no-task-count`` leaves the
server untouched). After the loops stop and the server settles, the promises
are checked (see ``check``): no turn lost or unexpected, open streams 0, threads,
tasks and fds back to the idle baseline, RSS flat after warm-up (least-squares
slope), no ERROR or traceback in the server's log, and SIGTERM exits 0 in time.

Prints a Markdown summary; ``--json FILE`` writes everything. Exit status 0 only
if every promise holds. Linux only (reads ``/proc``).

    python benchmarks/reliability/soak.py --minutes 10 --conversations 32
        --json bench-results/soak.json
    python benchmarks/reliability/soak.py --minutes 0.3 --conversations 8     # short mode, ~30 s
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio
import yaml
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection, connect_websocket

REPO = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"omnitrio serving .* at http://([\d.]+):(\d+)")
RESPONSE_LOG = re.compile(r"omnitrio\.server: realtime (resp_\w+) (\w+): first audio")
LOG_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.\-]+: ")

# The synthetic answer: TOKENS text deltas (the transcript) at TOKEN_MS each, and one
# audio chunk of CHUNK_SAMPLES at 16 kHz per TOKENS_PER_CHUNK tokens: 15 chunks of
# 200 ms = 3 s of audio, made in about 2.4 s (a little faster than real time).
TOKENS = 60
TOKEN_MS = 40.0
TOKENS_PER_CHUNK = 4  # code2wav: inputs_per_step 4, visible_every 4 (as configs/synthetic.yaml)
CHUNK_SAMPLES = 3200
STAGE_RATE_HZ = 16000
CHUNKS = TOKENS // TOKENS_PER_CHUNK
CHUNK_S = CHUNK_SAMPLES / STAGE_RATE_HZ

TURN_KINDS = {"normal": 0.55, "cancel": 0.15, "disconnect": 0.12, "slow": 0.18}
EXPECTED = {
    "normal": {"completed"},
    "slow": {"completed"},
    "cancel": {"cancelled", "cancel_too_late"},
    "disconnect": {"disconnected"},
}
AUDIO_INPUT_P = 0.2  # a turn sends committed input audio instead of a text item
INPUT_AUDIO_S = 0.5
CHURNY_P = 0.4  # a loop that opens a fresh connection every 1-5 turns
MAX_TURNS_PER_CONNECTION = 100  # keeps conversations far below max_conversation_items
TURN_TIMEOUT_S = 30.0
SLOW_CANCEL_S = 2.0  # cancel -> response.done slower than this is unexpected
SETTLE_S = 2.0
CONVERGE_S = 15.0  # longest wait for threads/tasks/fds to come back after the settle
GRACE_PERIOD_S = 2.0
EXIT_LIMIT_S = GRACE_PERIOD_S + 3.0
MIN_SLOPE_WINDOW_S = 180.0  # the RSS slope is enforced only over a window this long

# Loaded by the server (PYTHONPATH) when OMNITRIO_SOAK_TASKS_FILE is set: live trio tasks,
# written once a second by one reporter thread.
SITECUSTOMIZE = """\
import os

if os.environ.get("OMNITRIO_SOAK_TASKS_FILE"):
    import threading
    import time

    import trio

    _PATH = os.environ["OMNITRIO_SOAK_TASKS_FILE"]
    _run = trio.run

    def _tasks_living():
        return trio.lowlevel.current_statistics().tasks_living

    def _report(token):
        while True:
            try:
                n = trio.from_thread.run_sync(_tasks_living, trio_token=token)
            except trio.RunFinishedError:
                return
            with open(_PATH + ".tmp", "w") as f:
                f.write(f"{n}\\n")
            os.replace(_PATH + ".tmp", _PATH)
            time.sleep(1.0)

    class _TaskCounter(trio.abc.Instrument):
        def before_run(self):
            token = trio.lowlevel.current_trio_token()
            threading.Thread(
                target=_report, args=(token,), name="soak-task-counter", daemon=True
            ).start()

    def run(*args, **kwargs):
        kwargs["instruments"] = (*kwargs.get("instruments", ()), _TaskCounter())
        return _run(*args, **kwargs)

    trio.run = run
"""


# ----------------------------------------------------------------------------- records


@dataclass
class Turn:
    conv: int
    index: int
    connection: int
    kind: str
    input_audio: bool
    outcome: str = "failed"
    reason: str = ""
    response_id: str | None = None
    audio_deltas: int = 0
    audio_bytes: int = 0
    text_deltas: int = 0
    ttfa_s: float | None = None
    cancel_latency_s: float | None = None
    duration_s: float = 0.0
    server_status: str | None = None

    @property
    def expected(self) -> bool:
        return self.outcome in EXPECTED[self.kind]


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    threads: int
    fds: int
    tasks: int | None
    cpu_s: float
    open_streams: float | None
    streams: dict[str, float]
    connections: float | None


@dataclass
class Run:
    args: dict[str, Any]
    url: str = ""
    pid: int = 0
    input_rate_hz: int = 24000
    output_rate_hz: int = 24000
    turns: list[Turn] = field(default_factory=list)
    warmup_turns: list[Turn] = field(default_factory=list)
    connections: int = 0
    connect_failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    baseline: Sample | None = None
    end: Sample | None = None
    converge_s: float = 0.0
    load_s: float = 0.0


# ----------------------------------------------------------------------------- server


def write_config(folder: Path, conversations: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "synthetic.yaml").read_text())
    config["pipeline"]["name"] = "soak-synthetic"
    # Room for every conversation plus streams of dropped connections still being released.
    config["pipeline"]["max_streams"] = max(64, 2 * conversations)
    stages = {stage["name"]: stage for stage in config["stages"]}
    stages["thinker"]["params"].update(steps=TOKENS, service_time_ms=TOKEN_MS)
    code2wav = stages["code2wav"]["params"]
    assert code2wav["inputs_per_step"] == code2wav["visible_every"] == TOKENS_PER_CHUNK
    code2wav["audio_samples"] = CHUNK_SAMPLES
    path = folder / "soak.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_server(
    config: Path, folder: Path, count_tasks: bool
) -> tuple[subprocess.Popen[bytes], str, int, Path, Path | None]:
    stderr_path = folder / "server.stderr"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tasks_path: Path | None = None
    if count_tasks:
        (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
        tasks_path = folder / "tasks"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        env["OMNITRIO_SOAK_TASKS_FILE"] = str(tasks_path)
    command = [sys.executable, "-m", "omnitrio", "--log-level", "INFO"]
    command += ["run", "--config", str(config), "--port", "0"]
    command += ["--grace-period-s", str(GRACE_PERIOD_S)]
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr
        )
    assert process.stdout is not None
    found: list[tuple[str, int]] = []
    ready = threading.Event()

    def drain(stdout: Any) -> None:  # keeps the pipe from filling after the start-up line
        for raw in stdout:
            if not found and (match := SERVING.search(raw.decode(errors="replace"))):
                found.append((match.group(1), int(match.group(2))))
                ready.set()
        ready.set()

    threading.Thread(target=drain, args=(process.stdout,), daemon=True).start()
    ready.wait(60)
    if not found:
        process.kill()
        process.wait()
        raise SystemExit(f"soak: the server did not start:\n{stderr_path.read_text()}")
    host, port = found[0]
    return process, host, port, stderr_path, tasks_path


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> tuple[float, int, int]:
    """(VmRSS in MB, threads, open fds) of a process."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return int(fields["VmRSS"][0]) / 1024, int(fields["Threads"][0]), fds


def read_tasks(path: Path | None) -> int | None:
    """Live trio tasks in the server as its reporter thread last wrote them."""
    if path is None or not path.exists():
        return None
    return int(path.read_text().strip() or 0)


def fetch_metrics(host: str, port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def sample(run: Run, host: str, port: int, tasks_path: Path | None, t0: float) -> Sample:
    # Read before the request: the task reporter must not count our own request's task.
    tasks = read_tasks(tasks_path)
    rss, threads, fds = proc_status(run.pid)
    metrics = await trio.to_thread.run_sync(fetch_metrics, host, port)
    streams = {
        outcome: metrics.get(f'omnitrio_streams_total{{outcome="{outcome}"}}', 0.0)
        for outcome in ("completed", "cancelled", "failed", "refused")
    }
    return Sample(
        t_s=round(trio.current_time() - t0, 2),
        rss_mb=round(rss, 2),
        threads=threads,
        fds=fds,
        tasks=tasks,
        cpu_s=round(cpu_s(run.pid), 2),
        open_streams=metrics.get("omnitrio_open_streams"),
        streams=streams,
        connections=metrics.get("omnitrio_websocket_connections_total"),
    )


# ----------------------------------------------------------------------------- client


class Gone(Exception):
    """The connection ended (``reason`` says how) while a turn was reading."""


async def recv(ws: WebSocketConnection) -> dict[str, Any]:
    try:
        message = await ws.get_message()
    except ConnectionClosed as exc:
        reason = exc.reason
        raise Gone(f"connection closed {reason.code} {reason.reason or ''}".strip()) from None
    event = json.loads(message)
    assert isinstance(event, dict)
    return event


async def send(ws: WebSocketConnection, event: dict[str, Any]) -> None:
    try:
        await ws.send_message(json.dumps(event))
    except ConnectionClosed as exc:
        raise Gone(f"connection closed {exc.reason.code} while sending") from None


async def abort(ws: WebSocketConnection, rst: bool) -> None:
    """Close the TCP connection under the WebSocket: no close frame (RST if ``rst``)."""
    stream = ws._stream  # trio.SocketStream: the client is plain TCP on loopback
    if rst:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def close(ws: WebSocketConnection, graceful: bool) -> None:
    """End a connection we are done with: a close handshake if it is still up, and in any
    case the socket closed (a turn that timed out or saw an error leaves it open)."""
    if graceful:
        with trio.move_on_after(5):
            await ws.aclose()
    await trio.aclose_forcefully(ws._stream)


def input_audio(rng: random.Random, rate_hz: int) -> str:
    samples = int(INPUT_AUDIO_S * rate_hz)
    tone = rng.uniform(200, 800)
    pcm = b"".join(
        int(6000 * math.sin(2 * math.pi * tone * i / rate_hz)).to_bytes(2, "little", signed=True)
        for i in range(samples)
    )
    return base64.b64encode(pcm).decode()


async def run_turn(
    ws: WebSocketConnection, turn: Turn, rng: random.Random, run: Run
) -> WebSocketConnection | None:
    """Play one turn; sets its outcome. Returns None if the connection is gone."""
    started = trio.current_time()
    stop_after = rng.randint(1, CHUNKS - 3)  # audio deltas read before a cancel / disconnect
    cancel_with_id = rng.random() < 0.5
    slow_factor = rng.uniform(1.2, 1.8)
    rst = rng.random() < 0.5
    cancel_sent: float | None = None
    cancel_error = False
    done = False
    try:
        with trio.fail_after(TURN_TIMEOUT_S):
            if turn.input_audio:
                audio = input_audio(rng, run.input_rate_hz)
                await send(ws, {"type": "input_audio_buffer.append", "audio": audio})
                await send(ws, {"type": "input_audio_buffer.commit"})
            else:
                text = f"conversation {turn.conv} turn {turn.index}: say something long"
                item = {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                }
                await send(ws, {"type": "conversation.item.create", "item": item})
            await send(ws, {"type": "response.create"})
            while True:
                event = await recv(ws)
                kind = event.get("type")
                if kind == "error":
                    code = event["error"].get("code")
                    if code == "response_cancel_not_active" and cancel_sent is not None and done:
                        cancel_error = True
                        break
                    turn.reason = f"error event {code}: {event['error'].get('message')}"
                    return ws
                if kind == "response.created":
                    turn.response_id = event["response"]["id"]
                elif kind == "response.output_audio_transcript.delta":
                    turn.text_deltas += 1
                elif kind == "response.output_audio.delta":
                    if turn.ttfa_s is None:
                        turn.ttfa_s = trio.current_time() - started
                    turn.audio_deltas += 1
                    turn.audio_bytes += len(base64.b64decode(event["delta"]))
                    if cancel_sent is None and turn.audio_deltas == stop_after:
                        if turn.kind == "disconnect":
                            await abort(ws, rst)
                            turn.outcome = "disconnected"
                            turn.reason = "RST" if rst else "FIN"
                            return None
                        if turn.kind == "cancel":
                            cancel: dict[str, Any] = {"type": "response.cancel"}
                            if cancel_with_id:
                                cancel["response_id"] = turn.response_id
                            await send(ws, cancel)
                            cancel_sent = trio.current_time()
                    if turn.kind == "slow":
                        await trio.sleep(CHUNK_S * slow_factor)
                elif kind == "response.done":
                    done = True
                    response = event["response"]
                    if response["id"] != turn.response_id:
                        turn.reason = f"response.done for {response['id']}, not {turn.response_id}"
                        return ws
                    status = response["status"]
                    if cancel_sent is not None:
                        turn.cancel_latency_s = trio.current_time() - cancel_sent
                    if turn.kind == "cancel" and status == "completed" and cancel_sent:
                        continue  # the cancel came too late: wait for its error event
                    turn.outcome, turn.reason = classify(turn, response, status, run)
                    return ws
        if cancel_error:
            turn.outcome, turn.reason = classify(turn, {}, "completed", run)
            if turn.outcome == "completed":
                turn.outcome = "cancel_too_late"
        return ws
    except Gone as exc:
        turn.reason = str(exc)
        return None
    except trio.TooSlowError:
        turn.reason = f"no response.done within {TURN_TIMEOUT_S} s"
        return None
    finally:
        turn.duration_s = trio.current_time() - started


def classify(turn: Turn, response: dict[str, Any], status: str, run: Run) -> tuple[str, str]:
    """The outcome of a turn that got its response.done, checked against what was asked."""
    chunk_bytes = 2 * round(CHUNK_SAMPLES * run.output_rate_hz / STAGE_RATE_HZ)
    if status == "completed":
        if turn.audio_deltas != CHUNKS or turn.audio_bytes != CHUNKS * chunk_bytes:
            return (
                "failed",
                f"completed with {turn.audio_deltas} audio deltas, {turn.audio_bytes} B",
            )
        if turn.text_deltas != TOKENS:
            return "failed", f"completed with {turn.text_deltas} transcript deltas"
        return "completed", ""
    if status == "cancelled":
        reason = (response.get("status_details") or {}).get("reason")
        if turn.kind != "cancel":
            return "failed", f"cancelled ({reason}) without a cancel"
        if reason != "client_cancelled":
            return "failed", f"cancelled with reason {reason}"
        if turn.cancel_latency_s is not None and turn.cancel_latency_s > SLOW_CANCEL_S:
            return "failed", f"cancel took {turn.cancel_latency_s:.2f} s"
        return "cancelled", ""
    details = response.get("status_details")
    return "failed", f"response.done status {status}: {json.dumps(details)}"


async def open_connection(
    nursery: trio.Nursery, host: str, port: int, run: Run
) -> WebSocketConnection | str:
    try:
        ws = await connect_websocket(nursery, host, port, "/v1/realtime", use_ssl=False)
    except (HandshakeError, OSError) as exc:
        return f"connect failed: {exc!r}"
    try:
        with trio.fail_after(10):
            first = await recv(ws)
    except (Gone, trio.TooSlowError) as exc:
        return f"no session.created: {exc!r}"
    if first.get("type") != "session.created":
        return f"first event {first.get('type')}"
    run.connections += 1
    audio = first["session"]["audio"]
    run.input_rate_hz = int(audio["input"]["format"]["rate"])
    run.output_rate_hz = int(audio["output"]["format"]["rate"])
    return ws


async def conversation(
    conv: int, seed: int, host: str, port: int, until: float, run: Run, turns: list[Turn]
) -> None:
    rng = random.Random(f"{seed}:{conv}")
    churny = rng.random() < CHURNY_P
    index = 0
    connection = 0
    while trio.current_time() < until:
        connection += 1
        per_connection = rng.randint(1, 5) if churny else MAX_TURNS_PER_CONNECTION
        async with trio.open_nursery() as nursery:
            ws = await open_connection(nursery, host, port, run)
            if isinstance(ws, str):
                run.connect_failures.append(f"conversation {conv}: {ws}")
                nursery.cancel_scope.cancel()
                await trio.sleep(1.0)
                continue
            alive: WebSocketConnection | None = ws
            for _ in range(per_connection):
                if trio.current_time() >= until or alive is None:
                    break
                kind = rng.choices(list(TURN_KINDS), weights=list(TURN_KINDS.values()))[0]
                turn = Turn(conv, index, connection, kind, rng.random() < AUDIO_INPUT_P)
                turns.append(turn)
                index += 1
                alive = await run_turn(alive, turn, rng, run)
                await trio.sleep(rng.uniform(0.0, 0.3))  # the user thinks
            await close(ws, graceful=alive is not None)
            nursery.cancel_scope.cancel()


async def load(run: Run, host: str, port: int, tasks_path: Path | None) -> None:
    args = run.args
    duration_s = args["minutes"] * 60
    sample_s = min(args["sample_s"], max(1.0, duration_s / 10))

    async def warm_up(i: int) -> None:  # a text turn and an audio-input turn, at once
        async with trio.open_nursery() as nursery:
            ws = await open_connection(nursery, host, port, run)
            if isinstance(ws, str):
                raise SystemExit(f"soak: warm-up {ws}")
            turn = Turn(-1, i, i, "normal", i == 1)
            run.warmup_turns.append(turn)
            await run_turn(ws, turn, random.Random(i), run)
            await close(ws, graceful=True)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(warm_up, i)
    await trio.sleep(1.5)  # then the idle baseline  # let the task counter report the idle server
    t0 = trio.current_time()
    run.baseline = await sample(run, host, port, tasks_path, t0)
    until = t0 + duration_s
    async with trio.open_nursery() as nursery:

        async def sampler() -> None:
            while True:
                await trio.sleep(sample_s)
                run.samples.append(await sample(run, host, port, tasks_path, t0))

        nursery.start_soon(sampler)
        async with trio.open_nursery() as loops:
            for conv in range(args["conversations"]):
                loops.start_soon(
                    conversation, conv, args["seed"], host, port, until, run, run.turns
                )
                await trio.sleep(0.05)  # stagger the first connections a little
        run.load_s = trio.current_time() - t0
        nursery.cancel_scope.cancel()
    await trio.sleep(SETTLE_S)
    end = await sample(run, host, port, tasks_path, t0)
    waited = 0.0
    while not same_idle(run.baseline, end) and waited < CONVERGE_S:
        await trio.sleep(2.0)  # > the task reporter's period: it must not see our last request
        waited += 2.0
        end = await sample(run, host, port, tasks_path, t0)
    run.end, run.converge_s = end, waited


def same_idle(a: Sample, b: Sample) -> bool:
    return (a.threads, a.fds, a.tasks, b.open_streams) == (b.threads, b.fds, b.tasks, 0)


# ----------------------------------------------------------------------------- checks


def rss_slope(samples: list[Sample], warmup_s: float) -> tuple[float | None, float]:
    """Least-squares slope of RSS in MB per minute over samples after ``warmup_s``."""
    points = [(s.t_s / 60, s.rss_mb) for s in samples if s.t_s >= warmup_s]
    if len(points) < 3:
        return None, 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_m = statistics.fmean(m for _, m in points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (m - mean_m) for t, m in points) / den
    return slope, (points[-1][0] - points[0][0]) * 60


def scan_log(text: str) -> tuple[list[str], Counter[str], Counter[str]]:
    """(unexpected records verbatim, warnings by first line, INFO messages by shape)."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if LOG_RECORD.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    unexpected: list[str] = []
    warnings: Counter[str] = Counter()
    infos: Counter[str] = Counter()
    for record in records:
        head = record[0]
        body = "\n".join(record)
        if head.startswith(("ERROR ", "CRITICAL ")) or "Traceback" in body:
            unexpected.append(body)
        elif head.startswith("WARNING "):
            warnings[head] += 1
        elif head.startswith("INFO "):
            infos[re.sub(r"\b(resp|sess)_\w+|\d+(\.\d+)?", "#", head)] += 1
        elif head != "omnitrio: stopped":
            unexpected.append(body)
    return unexpected, warnings, infos


def reconcile(run: Run, server_log: str) -> list[str]:
    """Problems found matching our turns with the server's view of them."""
    problems = []
    statuses: dict[str, str] = {}
    for rid, status in RESPONSE_LOG.findall(server_log):
        if rid in statuses:
            problems.append(f"server logged {rid} twice ({statuses[rid]}, {status})")
        statuses[rid] = status
    ours = {t.response_id: t for t in run.turns + run.warmup_turns if t.response_id}
    want = {"completed": "completed", "cancel_too_late": "completed", "cancelled": "cancelled"}
    for rid, turn in ours.items():
        turn.server_status = statuses.get(rid)
        if turn.outcome in want and turn.server_status != want[turn.outcome]:
            problems.append(
                f"{rid} ({turn.kind}, ours {turn.outcome}): server logged {turn.server_status}"
            )
    for rid in statuses.keys() - ours.keys():
        problems.append(f"server logged {rid} ({statuses[rid]}) which no turn of ours started")
    no_id = [t for t in run.turns if t.response_id is None]
    for turn in no_id:
        problems.append(f"turn {turn.conv}/{turn.index} got no response.created ({turn.reason})")
    assert run.end is not None
    total = sum(run.end.streams.values())
    if total != len(ours):
        problems.append(f"server streams total {total:.0f} != responses we started {len(ours)}")
    if run.end.connections is not None and run.end.connections != run.connections:
        problems.append(
            f"server accepted {run.end.connections:.0f} connections, we opened {run.connections}"
        )
    return problems


@dataclass
class Verdict:
    promise: str
    ok: bool
    measured: str


def check(run: Run, log: str, exit_code: int | None, exit_s: float) -> dict[str, Any]:
    assert run.baseline is not None
    assert run.end is not None
    base, end = run.baseline, run.end
    turns = run.turns
    outcomes = Counter(t.outcome for t in turns)
    by_kind = {k: Counter(t.outcome for t in turns if t.kind == k) for k in TURN_KINDS}
    unexpected_turns = [t for t in turns + run.warmup_turns if not t.expected]
    problems = reconcile(run, log)
    unexpected_log, warnings, infos = scan_log(log)
    duration_s = run.args["minutes"] * 60
    warmup_s = min(max(60.0, 0.2 * duration_s), 0.5 * duration_s)
    slope, window_s = rss_slope(run.samples, warmup_s)
    after_warmup = [s for s in run.samples if s.t_s >= warmup_s]
    max_slope = run.args["max_rss_slope"]
    enforce_slope = window_s >= MIN_SLOPE_WINDOW_S
    ttfa = sorted(t.ttfa_s for t in turns if t.kind == "normal" and t.ttfa_s is not None)
    cancel_lat = sorted(t.cancel_latency_s for t in turns if t.cancel_latency_s is not None)
    verdicts = [
        Verdict(
            "every turn accounted for, none unexpected",
            not unexpected_turns and sum(outcomes.values()) == len(turns) and len(turns) > 0,
            f"{len(turns)} turns: "
            + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
            + f"; {len(unexpected_turns)} unexpected",
        ),
        Verdict(
            "server agrees turn by turn (log per response id, stream totals, connections)",
            not problems,
            f"{len(problems)} mismatches",
        ),
        Verdict(
            "open streams back to 0", end.open_streams == 0, f"{end.open_streams:.0f} at the end"
        ),
        Verdict(
            "threads back to the idle baseline",
            end.threads == base.threads,
            f"{base.threads} -> {end.threads} (max {max(s.threads for s in run.samples)})",
        ),
        Verdict(
            "trio tasks back to the idle baseline",
            end.tasks == base.tasks,
            f"{base.tasks} -> {end.tasks} (max {max((s.tasks or 0) for s in run.samples)})"
            if base.tasks is not None
            else "not measured (--no-task-count)",
        ),
        Verdict(
            "open file descriptors back to the idle baseline",
            end.fds == base.fds,
            f"{base.fds} -> {end.fds} (max {max(s.fds for s in run.samples)})",
        ),
        Verdict(
            f"RSS flat after warm-up (slope <= {max_slope} MB/min over >= "
            f"{MIN_SLOPE_WINDOW_S / 60:.0f} min)",
            slope is not None and (slope <= max_slope or not enforce_slope),
            (
                f"{slope:+.3f} MB/min over {window_s / 60:.1f} min after {warmup_s:.0f} s; "
                f"{base.rss_mb:.1f} MB idle -> {after_warmup[0].rss_mb:.1f} after warm-up -> "
                f"{end.rss_mb:.1f} MB end"
                + ("" if enforce_slope else " (window too short: reported, not enforced)")
            )
            if slope is not None and after_warmup
            else "too few samples",
        ),
        Verdict(
            "no ERROR / traceback in the server log not caused on purpose",
            not unexpected_log,
            f"{len(unexpected_log)} unexpected records; {sum(warnings.values())} warnings",
        ),
        Verdict(
            f"SIGTERM: exit 0 within {EXIT_LIMIT_S:.0f} s",
            exit_code == 0 and exit_s <= EXIT_LIMIT_S,
            f"exit {exit_code} after {exit_s:.2f} s",
        ),
    ]
    if duration_s >= 60:
        missing = [k for k in TURN_KINDS if not by_kind[k]]
        verdicts.append(
            Verdict("every kind of turn exercised", not missing, f"missing: {missing or 'none'}")
        )
    return {
        "verdicts": [asdict(v) for v in verdicts],
        "ok": all(v.ok for v in verdicts),
        "outcomes": dict(outcomes),
        "by_kind": {k: dict(v) for k, v in by_kind.items()},
        "input_audio_turns": sum(t.input_audio for t in turns),
        "connections": run.connections,
        "connect_failures": run.connect_failures,
        "unexpected_turns": [asdict(t) for t in unexpected_turns],
        "server_mismatches": problems,
        "disconnects_logged_by_server": Counter(
            str(t.server_status) for t in turns if t.outcome == "disconnected"
        ),
        "server_streams_end": end.streams,
        "max_open_streams": max((s.open_streams or 0) for s in run.samples),
        "rss_slope_mb_per_min": slope,
        "rss_window_s": window_s,
        "warmup_s": warmup_s,
        "converge_s": run.converge_s,
        "ttfa_s": percentiles(ttfa),
        "cancel_latency_s": percentiles(cancel_lat),
        "unexpected_log": unexpected_log,
        "warnings": dict(warnings),
        "info_shapes": dict(infos.most_common(20)),
        "exit_code": exit_code,
        "exit_s": exit_s,
    }


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 4)

    return {"n": len(values), "p50": at(0.5), "p99": at(0.99), "max": round(values[-1], 4)}


def markdown(run: Run, result: dict[str, Any]) -> str:
    assert run.baseline is not None
    assert run.end is not None
    a = run.args
    lines = [
        f"## Soak: {a['conversations']} conversations, {a['minutes']} min, seed {a['seed']}",
        "",
        "| promise | measured | ok |",
        "|---|---|---|",
    ]
    lines += [
        f"| {v['promise']} | {v['measured']} | {'yes' if v['ok'] else '**NO**'} |"
        for v in result["verdicts"]
    ]
    lines += ["", "| turn kind | " + " | ".join(sorted(EXPECTED_ALL)) + " |"]
    lines += ["|---|" + "---|" * len(EXPECTED_ALL)]
    for kind, counts in result["by_kind"].items():
        cells = " | ".join(str(counts.get(o, 0)) for o in sorted(EXPECTED_ALL))
        lines.append(f"| {kind} | {cells} |")
    total = result["outcomes"]
    lines.append(
        "| **all** | " + " | ".join(str(total.get(o, 0)) for o in sorted(EXPECTED_ALL)) + " |"
    )
    ttfa, cancel = result["ttfa_s"], result["cancel_latency_s"]
    server_cpu = run.samples[-1].cpu_s - run.baseline.cpu_s
    streams = ", ".join(f"{k} {v:.0f}" for k, v in result["server_streams_end"].items())
    lines += [
        "",
        "| figure | value |",
        "|---|---|",
        f"| load time | {run.load_s:.0f} s |",
        f"| server CPU during load | {server_cpu:.0f} s ({100 * server_cpu / run.load_s:.0f} % "
        "of one core) |",
        f"| connections opened | {run.connections} ({len(run.connect_failures)} failed) |",
        f"| turns with committed input audio | {result['input_audio_turns']} |",
        f"| server streams at end | {streams} |",
        f"| open streams: max during load / at end | {result['max_open_streams']:.0f} / "
        f"{run.end.open_streams:.0f} |",
        f"| threads idle / end | {run.baseline.threads} / {run.end.threads} |",
        f"| trio tasks idle / end | {run.baseline.tasks} / {run.end.tasks} |",
        f"| fds idle / end | {run.baseline.fds} / {run.end.fds} |",
        f"| RSS idle / end (MB) | {run.baseline.rss_mb:.1f} / {run.end.rss_mb:.1f} |",
        f"| RSS slope after warm-up | {fmt(result['rss_slope_mb_per_min'], '+.3f')} MB/min |",
        f"| time to first audio (normal turns) | {fmt_pct(ttfa)} |",
        f"| cancel -> response.done | {fmt_pct(cancel)} |",
        f"| disconnected turns by server log status | "
        f"{dict(result['disconnects_logged_by_server'])} |",
        f"| server ERROR / traceback records | {len(result['unexpected_log'])} |",
        f"| server WARNING records | {sum(result['warnings'].values())} |",
        f"| SIGTERM -> exit | code {result['exit_code']} in {result['exit_s']:.2f} s |",
    ]
    if result["unexpected_turns"]:
        lines += ["", "Unexpected turns (first 20):", ""]
        for t in result["unexpected_turns"][:20]:
            lines.append(
                f"- conv {t['conv']} turn {t['index']} ({t['kind']}): {t['outcome']} {t['reason']}"
            )
    for title, items in (
        ("Server mismatches", result["server_mismatches"]),
        ("Unexpected server log records", result["unexpected_log"]),
        ("Connection failures", result["connect_failures"]),
    ):
        if items:
            lines += ["", f"{title} (first 10, verbatim):", ""]
            lines += [f"```\n{item}\n```" for item in items[:10]]
    if result["warnings"]:
        lines += ["", "Server warnings:", ""]
        lines += [f"- {n} x `{w}`" for w, n in result["warnings"].items()]
    lines += ["", f"Result: {'PASS' if result['ok'] else 'FAIL'}"]
    return "\n".join(lines)


EXPECTED_ALL = {o for outcomes in EXPECTED.values() for o in outcomes} | {"failed"}


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def fmt_pct(p: dict[str, float] | None) -> str:
    if p is None:
        return "n/a"
    ms = {k: p[k] * 1000 for k in ("p50", "p99", "max")}
    return f"p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} ms, max {ms['max']:.0f} ms (n={p['n']})"


# ----------------------------------------------------------------------------- main


def stop_server(process: subprocess.Popen[bytes]) -> tuple[int | None, float]:
    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        code = process.wait(timeout=EXIT_LIMIT_S + 10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None, time.monotonic() - started
    return code, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    parser.add_argument("--conversations", type=int, default=32, help="concurrent loops")
    parser.add_argument("--seed", type=int, default=1, help="RNG seed for the turn choices")
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument("--sample-s", type=float, default=5.0, help="sampling period (s)")
    parser.add_argument(
        "--max-rss-slope",
        type=float,
        default=1.0,
        help="MB/min allowed after warm-up (enforced over windows of 3 min or more)",
    )
    parser.add_argument(
        "--no-task-count",
        dest="count_tasks",
        action="store_false",
        help="do not load the task-counting sitecustomize into the server",
    )
    parser.add_argument("--keep-log", type=Path, help="copy the server's stderr here")
    args = parser.parse_args(argv)
    if not Path("/proc/self/status").exists():
        raise SystemExit("soak: needs Linux /proc")
    run = Run(args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
    with tempfile.TemporaryDirectory(prefix="omnitrio-soak-") as tmp:
        folder = Path(tmp)
        config = write_config(folder, args.conversations)
        process, host, port, stderr_path, tasks_path = start_server(
            config, folder, args.count_tasks
        )
        run.url, run.pid = f"http://{host}:{port}", process.pid
        print(
            f"soak: server pid {process.pid} at {run.url}; load for {args.minutes} min", flush=True
        )
        exit_code: int | None = None
        exit_s = 0.0
        try:
            limit = args.minutes * 60 + TURN_TIMEOUT_S + CONVERGE_S + 60
            trio.run(lambda: run_with_limit(run, host, port, tasks_path, limit))
        finally:
            if process.poll() is None:
                exit_code, exit_s = stop_server(process)
            else:
                exit_code = process.returncode
            log = stderr_path.read_text(errors="replace")
            if args.keep_log:
                args.keep_log.write_text(log)
    result = check(run, log, exit_code, exit_s)
    print(markdown(run, result))
    if args.json:
        payload = {
            "run": {k: v for k, v in asdict(run).items() if k not in ("turns", "warmup_turns")},
            "result": result,
            "turns": [asdict(t) for t in run.turns],
        }
        args.json.write_text(json.dumps(payload, indent=1, default=str))
    return 0 if result["ok"] else 1


async def run_with_limit(
    run: Run, host: str, port: int, tasks_path: Path | None, limit: float
) -> None:
    with trio.fail_after(limit):
        await load(run, host, port, tasks_path)


if __name__ == "__main__":
    sys.exit(main())
