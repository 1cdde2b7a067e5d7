"""Issue 27's attacks (one client hurting another), for ``reliability/attacks.py``.

Each starts a fresh ``omnitrio run`` (synthetic pipeline) from the checkout, sends the
hostile requests from one thread while a normal client times plain chats from
another, and reports what the attacker got and the normal chats' median and worst
latency against the same chats without the attacker (``ratio``).
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attacks import Server, chat, http  # type: ignore[import-not-found]


def _normal(port: int, count: int) -> list[float]:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        status, _ = chat(port, "hi")
        seconds.append(time.perf_counter() - started)
        assert status == 200, status
    return seconds


def _beside(port: int, attack: Callable[[], str]) -> str:
    """The attack's own report, then the normal chats' figures beside it."""
    alone = _normal(port, 20)
    during: list[float] = []
    outcome: list[str] = []
    attacker = threading.Thread(target=lambda: outcome.append(attack()))
    attacker.start()
    while attacker.is_alive() or len(during) < 20:
        during += _normal(port, 1)
    attacker.join()
    ratio = statistics.median(during) / statistics.median(alone)
    return (
        f"{outcome[0]}; normal chats 200: {len(during)}/{len(during)}, median "
        f"{statistics.median(alone) * 1000:.0f} -> {statistics.median(during) * 1000:.0f} ms "
        f"(ratio {ratio:.2f}), worst {max(alone) * 1000:.0f} -> {max(during) * 1000:.0f} ms"
    )


def _post(port: int, body: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    status, data = http(
        port,
        "POST",
        "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
        timeout_s=120,
    )
    try:
        return status, json.loads(data)
    except ValueError:
        return status, {"raw": data[:200].decode(errors="replace")}


def _tools(count: int, tag: str) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {"x": {"type": "string", "enum": ["a", "b"]}}}
    return [
        {"type": "function", "function": {"name": f"f{tag}_{i}", "parameters": schema}}
        for i in range(count)
    ]


def attack_tools_flood(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    messages = [{"role": "user", "content": "hi"}]

    def attack() -> str:
        tiny = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(19_000)]
        started = time.perf_counter()
        status, _ = _post(server.port, {"model": "m", "messages": messages, "tools": tiny})
        first = f"19,000 tools: {status} in {time.perf_counter() - started:.2f} s"
        statuses: Counter[int | None] = Counter()
        for rounds in range(10):
            body = {"model": "m", "messages": messages, "tools": _tools(128, str(rounds))}
            statuses[_post(server.port, body)[0]] += 1
        return f"{first}; 10 x 128 fresh tools: {dict(statuses)}"

    try:
        return _beside(server.port, attack)
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
        status, answer = _post(server.port, body)
        return f"{status} param {answer.get('error', {}).get('param')}"

    try:
        return _beside(server.port, attack)
    finally:
        server.stop()


def attack_fields(checkout: Path, fd_limit: int) -> str:
    """seed 2**70 / -2**70, max_tokens 10**9, arguments "[" * 200000, /static/ a/ x
    3000, a 2 MB body, audio_end_ms 1e308: status, param, and server tracebacks."""
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
    results = []
    try:
        for label, body in (
            ("seed 2**70", {"messages": messages, "seed": 2**70}),
            ("seed -2**70", {"messages": messages, "seed": -(2**70)}),
            ("max_tokens 10**9", {"messages": messages, "max_tokens": 10**9}),
            ("arguments [ x 200000", {"messages": deep}),
        ):
            status, answer = _post(server.port, {"model": "m", **body})
            results.append(f"{label}: {status} {answer.get('error', {}).get('param')}")
        status, data = http(server.port, "GET", "/static/" + "a/" * 3000)
        results.append(f"/static/ a/ x 3000: {status}")
        status, data = http(server.port, "POST", "/v1/chat/completions", b"x" * (2 << 20))
        results.append(f"2 MB body: {status} {'JSON' if data.startswith(b'{') else 'not JSON'}")
        results.append(f"tracebacks {server.tracebacks()}, log lines {len(server.stderr)}")
    finally:
        server.stop()
    return "; ".join(results)


def attack_stream_share(checkout: Path, fd_limit: int) -> str:
    """One client opens 64 endless streaming chats (max_streams 64): how many it gets,
    and whether another client (another address) is served meanwhile."""
    server = Server(checkout, endless=True)
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    held, statuses = [], Counter()
    try:
        for _ in range(64):
            sock = socket.create_connection(
                ("127.0.0.1", server.port), source_address=("127.0.0.2", 0)
            )
            sock.sendall(head + body)
            statuses[int(sock.recv(12).split()[1])] += 1
            held.append(sock)
        other = socket.create_connection(("127.0.0.1", server.port))
        other.sendall(head + body)
        served = other.recv(12).decode()
        other.close()
        return f"attacker: {dict(statuses)}; another client: {served!r}"
    finally:
        for sock in held:
            sock.close()
        server.stop()


ISOLATION_ATTACKS: dict[str, Callable[[Path, int], str]] = {
    "tools-flood": attack_tools_flood,
    "ref-cycle": attack_ref_cycle,
    "fields": attack_fields,
    "stream-share": attack_stream_share,
}
