"""Issue 27's attacks (one client hurting another), for ``benchmarks/reliability/attacks.py``.

Each starts a fresh ``omnitrio run`` (synthetic pipeline) from the checkout, sends the
hostile requests from one thread (from 127.0.0.2) while a normal client times plain
chats from another (127.0.0.1), and reports what the attacker got, the normal chats
that failed, and their median and worst latency against the same chats without the
attacker (``ratio``); and the server's tracebacks (a 5xx from client input logs one).
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import websockets.sync.client
from attacks import API_KEY, Server, http  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the helper shared with tests/
from tests.conftest import COMMAS_ITEM, HUGE_TRUNCATE, distinct_tools, realtime_tool_rounds

ATTACKER = "127.0.0.2"


NORMAL_FIELDS = {"max_tokens": 24}
"""A normal chat asks for the synthetic answer's length (it ends on an endless server too)."""


def _normal(port: int, count: int, failed: Counter[int | None]) -> list[float]:
    """``count`` normal chats one after another: the seconds of each that got 200
    (the others counted in ``failed`` by status)."""
    seconds = []
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **NORMAL_FIELDS}
    for _ in range(count):
        started = time.perf_counter()
        status, _ = _post(port, body)
        if status == 200:
            seconds.append(time.perf_counter() - started)
        else:
            failed[status] += 1
    return seconds


def _beside(server: Server, attack: Callable[[], str]) -> str:
    """The attack's own report, then the normal chats' figures beside it."""
    port = server.port
    failed: Counter[int | None] = Counter()
    alone = _normal(port, 20, failed)
    during: list[float] = []
    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.append(attack())
        except Exception as exc:  # reported, and the normal chats' figures still are
            outcome.append(f"attack failed: {type(exc).__name__}: {exc}")

    attacker = threading.Thread(target=run)
    attacker.start()
    while attacker.is_alive() or len(during) + sum(failed.values()) < 20:
        during += _normal(port, 1, failed)
    attacker.join()
    ratio = statistics.median(during) / statistics.median(alone) if during else float("nan")
    return (
        f"{outcome[0]}; normal chats failed {sum(failed.values())} {dict(failed)} of "
        f"{len(during) + sum(failed.values())}, median {statistics.median(alone) * 1000:.0f}"
        f" -> {statistics.median(during) * 1000:.0f} ms (ratio {ratio:.2f}), worst "
        f"{max(alone) * 1000:.0f} -> {max(during) * 1000:.0f} ms; "
        f"server tracebacks {server.tracebacks()}"
    )


def _post(
    port: int, body: dict[str, Any], source: str = "127.0.0.1"
) -> tuple[int | None, dict[str, Any]]:
    status, data = http(
        port,
        "POST",
        "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
        timeout_s=120,
        source=source,
    )
    try:
        return status, json.loads(data)
    except ValueError:
        return status, {"raw": data[:200].decode(errors="replace")}


def attack_tools_flood(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    messages = [{"role": "user", "content": "hi"}]

    def attack() -> str:
        tiny = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(19_000)]
        started = time.perf_counter()
        status, _ = _post(
            server.port, {"model": "m", "messages": messages, "tools": tiny}, ATTACKER
        )
        first = f"19,000 tools: {status} in {time.perf_counter() - started:.2f} s"
        statuses: Counter[int | None] = Counter()
        for rounds in range(10):
            body = {"model": "m", "messages": messages, "tools": distinct_tools(128, str(rounds))}
            statuses[_post(server.port, body, ATTACKER)[0]] += 1
        return f"{first}; 10 x 128 fresh tools: {dict(statuses)}"

    try:
        return _beside(server, attack)
    finally:
        server.stop()


def attack_ref_cycle(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    tool = {
        "type": "function",
        "function": {
            "name": "tree",
            "parameters": {
                "type": "object",
                "properties": {"n": {"$ref": "#"}},
                "required": ["n"],
            },
        },
    }

    def attack() -> str:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [tool],
            "tool_choice": "required",
        }
        status, answer = _post(server.port, body, ATTACKER)
        return f"{status} param {answer.get('error', {}).get('param')}"

    try:
        return _beside(server, attack)
    finally:
        server.stop()


def attack_fields(checkout: Path, fd_limit: int) -> str:
    """seed 2**70 / -2**70, max_tokens 10**9, arguments "[" * 200000, /static/ a/ x
    3000, a 2 MB body on each /v1 POST: status and param, beside normal chats."""
    server = Server(checkout)
    messages = [{"role": "user", "content": "x"}]
    deep = [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": "[" * 200_000},
                }
            ],
        }
    ]

    def attack() -> str:
        results = []
        for label, body in (
            ("seed 2**70", {"messages": messages, "seed": 2**70}),
            ("seed -2**70", {"messages": messages, "seed": -(2**70)}),
            ("max_tokens 10**9", {"messages": messages, "max_tokens": 10**9}),
            ("arguments [ x 200000", {"messages": deep}),
        ):
            status, answer = _post(server.port, {"model": "m", **body}, ATTACKER)
            results.append(f"{label}: {status} {answer.get('error', {}).get('param')}")
        status, _ = http(server.port, "GET", "/static/" + "a/" * 3000, source=ATTACKER)
        results.append(f"/static/ a/ x 3000: {status}")
        for path, kind in BODY_POSTS:
            status, data = http(
                server.port, "POST", path, b"x" * (2 << 20), {"Content-Type": kind}, source=ATTACKER
            )
            shape = "JSON" if data.startswith(b'{"error"') else "not JSON"
            results.append(f"2 MB body to {path}: {status} {shape}")
        return ", ".join(results)

    try:
        return _beside(server, attack)
    finally:
        server.stop()


BODY_POSTS = (
    ("/v1/chat/completions", "application/json"),
    ("/v1/audio/speech", "application/json"),
    ("/v1/audio/transcriptions", "multipart/form-data; boundary=b0undary"),
)


def attack_realtime_tools(checkout: Path, fd_limit: int) -> str:
    """A Realtime session.update with 6,500 tools, then 8 with 128 fresh tools each."""
    server = Server(checkout)

    def attack() -> str:
        replies: Counter[str] = Counter()
        slowest_s = 0.0
        with websockets.sync.client.connect(
            f"ws://127.0.0.1:{server.port}/v1/realtime", max_size=None, open_timeout=30
        ) as ws:
            ws.recv(timeout=30)  # session.created
            for tools in realtime_tool_rounds(""):
                update = {"type": "session.update", "session": {"type": "realtime", "tools": tools}}
                started = time.perf_counter()
                ws.send(json.dumps(update))
                reply = json.loads(ws.recv(timeout=120))
                slowest_s = max(slowest_s, time.perf_counter() - started)
                error = reply.get("error", {}).get("code") if reply["type"] == "error" else None
                replies[f"{reply['type']}{f' {error}' if error else ''}"] += 1
        return f"6,500 then 8 x 128 tools: {dict(replies)}, slowest reply {slowest_s:.2f} s"

    try:
        return _beside(server, attack)
    finally:
        server.stop()


def attack_small(checkout: Path, fd_limit: int) -> str:
    """Realtime: a text item of 48 KB of "1,2," in one string, then a truncate with
    audio_end_ms 1e308; a transcription of a WAV with bits_per_sample 0; a streaming
    chat whose client leaves (is it logged?) -- beside normal chats."""
    server = Server(checkout)
    item, truncate = COMMAS_ITEM, HUGE_TRUNCATE

    def attack() -> str:
        results = []
        with websockets.sync.client.connect(
            f"ws://127.0.0.1:{server.port}/v1/realtime", max_size=None, open_timeout=30
        ) as ws:
            ws.recv(timeout=30)  # session.created
            ws.send(json.dumps(item))
            reply = json.loads(ws.recv(timeout=30))
            code = reply.get("error", {}).get("code", "")
            results.append(f"48 KB of '1,2,': {reply['type']} {code}".strip())
            ws.send(json.dumps(truncate))
            while (reply := json.loads(ws.recv(timeout=30)))["type"] != "error":
                pass
            results.append(f"audio_end_ms 1e308: error of {len(reply['error']['message'])} chars")
        wav = b"RIFF" + struct.pack("<I", 36 + 3200) + b"WAVEfmt "
        wav += struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 0) + b"data"
        wav += struct.pack("<I", 3200) + b"\1\0" * 1600
        form = (
            b'--b0undary\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
            b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + wav + b"\r\n--b0undary--\r\n"
        )
        kind = {"Content-Type": "multipart/form-data; boundary=b0undary"}
        status, data = http(
            server.port, "POST", "/v1/audio/transcriptions", form, kind, source=ATTACKER
        )
        results.append(f"WAV bits_per_sample 0: {status} {data[:60]!r}")
        lines = len(server.stderr)
        sock = socket.create_connection(("127.0.0.1", server.port), source_address=(ATTACKER, 0))
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        ).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        sock.recv(200)
        sock.close()
        time.sleep(1.0)
        logged = any("disconnected" in line for line in server.stderr[lines:])
        results.append(f"a streaming chat left by its client: logged {logged}")
        return ", ".join(results)

    try:
        return _beside(server, attack)
    finally:
        server.stop()


def attack_auth(checkout: Path, fd_limit: int) -> str:
    """With an API key: ``bearer KEY`` (the scheme is case-insensitive) and a bare key."""
    server = Server(checkout, api_key=API_KEY)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    try:
        seen = []
        for value in (f"Bearer {API_KEY}", f"bearer {API_KEY}", API_KEY):
            headers = {"Authorization": value, "Content-Type": "application/json"}
            status, _ = http(server.port, "POST", "/v1/chat/completions", body, headers)
            seen.append(f"{value.replace(API_KEY, 'KEY')!r}: {status}")
        return ", ".join(seen)
    finally:
        server.stop()


def _endless_chat(port: int, source: str, fields: dict[str, Any]) -> socket.socket:
    """A streaming chat from ``source``, its status line read; the socket left open."""
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, **fields}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(head + body)
    return sock


def _status(sock: socket.socket) -> int:
    return int(sock.recv(12).split()[1])


def attack_stream_share(checkout: Path, fd_limit: int) -> str:
    """One client opens 64 endless streaming chats (max_streams 64) and holds them 8 s:
    how many it gets, and how the normal client (another address) fares meanwhile."""
    server = Server(checkout, endless=True)

    def attack() -> str:
        held = [_endless_chat(server.port, ATTACKER, {}) for _ in range(64)]
        try:
            statuses = Counter(_status(sock) for sock in held)
            time.sleep(8.0)  # held while the normal client's chats are timed
        finally:
            for sock in held:
                sock.close()
        return f"attacker's 64 endless streams: {dict(statuses)}"

    try:
        return _beside(server, attack)
    finally:
        server.stop()


ISOLATION_ATTACKS: dict[str, Callable[[Path, int], str]] = {
    "tools-flood": attack_tools_flood,
    "ref-cycle": attack_ref_cycle,
    "fields": attack_fields,
    "stream-share": attack_stream_share,
    "realtime-tools": attack_realtime_tools,
    "small": attack_small,
    "auth": attack_auth,
}
