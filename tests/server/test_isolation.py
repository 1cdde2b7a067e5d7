"""One client cannot hurt another (issue 27): each test sends a hostile request BESIDE
normal clients, on the real server over loopback, and asserts the normal clients'
outcome (every one served, and their latency as a ratio against the same requests
without the attacker), besides the attacker's clear refusal. ``benchmarks/reliability/attacks.py``
runs the same attacks at full size against ``omnitrio run``.

Clients are told apart by address: the attacker connects from 127.0.0.2, the normal
clients from 127.0.0.1 (both loopback)."""

from __future__ import annotations

import json
import logging
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio_websocket
import websockets.sync.client

from tests.conftest import (
    COMMAS_ITEM,
    HUGE_TRUNCATE,
    distinct_tools,
    http_request,
    realtime_tool_rounds,
    serve_chain,
)

SPEAKING = [  # a normal chat takes ~70 ms of (slept) model time
    {"steps": 6, "service_time_ms": 10.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
ENDLESS = [
    {"steps": 100_000, "service_time_ms": 5.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
ATTACKER = "127.0.0.2"
NORMAL = "127.0.0.1"


async def _server(
    nursery: trio.Nursery,
    stages: list[dict[str, object]] = SPEAKING,
    max_streams: int = 8,
    **settings: object,
) -> int:
    return await serve_chain(nursery, stages, max_streams, **settings)


def _chat(port: int, source: str = NORMAL, **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | fields
    status, _, data = http_request(
        port, "POST", "/v1/chat/completions", json.dumps(body).encode(), source=source
    )
    return status, json.loads(data) if data.startswith(b"{") else {}


def _normal_latencies(port: int, count: int) -> list[float]:
    """``count`` normal chats one after another: each one's seconds (all must be 200)."""
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        status, _ = _chat(port)
        seconds.append(time.perf_counter() - started)
        assert status == 200
    return seconds


def _beside(port: int, attack: Callable[[threading.Event], None], count: int) -> list[float]:
    """Normal chats' latencies while ``attack`` runs in its own thread: at least ``count``
    of them, and on until the attack is over (``attack`` may also stop when told)."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            attack(stop)
        except BaseException as exc:
            failure.append(exc)

    attacker = threading.Thread(target=run)
    attacker.start()
    seconds: list[float] = []
    try:
        while len(seconds) < count or attacker.is_alive():
            seconds += _normal_latencies(port, 1)
    finally:
        stop.set()
        attacker.join()
    if failure:
        raise failure[0]
    return seconds


def _assert_unhurt(baseline: list[float], during: list[float], attack_s: list[float]) -> None:
    """Normal chats were not held by the attack: none waited as long as the attacker's
    slowest request (a stall makes them wait about as long), and their median is within
    3x of the same chats alone. (In-process, the attacker's client shares the GIL with
    the server; ``benchmarks/reliability/attacks.py`` measures the 1.5x target with the attacker,
    the normal client and the server in separate processes.)"""
    assert max(during) < max(attack_s), (during, attack_s)
    ratio = statistics.median(during) / statistics.median(baseline)
    assert ratio < 3, (ratio, baseline, during)


async def test_a_tools_flood_is_bounded_and_checked_off_the_event_loop(
    nursery: trio.Nursery,
) -> None:
    # Issue 27 #1: a chat with 19,000 tiny tools took 16.8 s of the event loop (the
    # whole server stalled: a normal chat waited up to 16.5 s).
    port = await _server(nursery)
    baseline = await trio.to_thread.run_sync(_normal_latencies, port, 12)
    outcomes: list[int] = []
    attack_s: list[float] = []

    def attack(stop: threading.Event) -> None:
        started = time.perf_counter()
        tiny = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(19_000)]
        status, body = _chat(port, ATTACKER, tools=tiny)  # 0.9 MB
        assert status == 400, body
        assert body["error"]["param"] == "tools"
        assert "19000 tools are more than the limit of 128" in body["error"]["message"]
        attack_s.append(time.perf_counter() - started)
        for rounds in range(8):  # then the most a request may carry, never the same twice
            started = time.perf_counter()
            status, body = _chat(port, ATTACKER, tools=distinct_tools(128, str(rounds)))
            attack_s.append(time.perf_counter() - started)
            outcomes.append(status)

    during = await trio.to_thread.run_sync(_beside, port, attack, 12)
    assert outcomes
    assert set(outcomes) <= {200, 429}, outcomes
    _assert_unhurt(baseline, during, attack_s)


def _realtime_tools_flood(port: int, replies: list[str], attack_s: list[float]) -> None:
    """A session.update with 6,500 tools, then 8 with 128 fresh tools each: each reply
    (the error's message or the event type) and how long it took."""
    with websockets.sync.client.connect(
        f"ws://127.0.0.1:{port}/v1/realtime", max_size=None, open_timeout=30
    ) as ws:
        ws.recv(timeout=30)  # session.created
        for tools in realtime_tool_rounds("rt"):
            update = {"type": "session.update", "session": {"type": "realtime", "tools": tools}}
            started = time.perf_counter()
            ws.send(json.dumps(update))
            reply = json.loads(ws.recv(timeout=60))
            attack_s.append(time.perf_counter() - started)
            replies.append(reply["error"]["message"] if reply["type"] == "error" else reply["type"])


async def test_a_realtime_tools_flood_leaves_other_clients_served(nursery: trio.Nursery) -> None:
    # Issue 27 #1 over Realtime: 3 session.update frames of 6,500 tools stalled the
    # server 15-20 s.
    port = await _server(nursery)
    baseline = await trio.to_thread.run_sync(_normal_latencies, port, 12)
    replies: list[str] = []
    attack_s: list[float] = []

    def attack(stop: threading.Event) -> None:
        _realtime_tools_flood(port, replies, attack_s)

    during = await trio.to_thread.run_sync(_beside, port, attack, 12)
    assert "6500 tools are more than the limit of 128" in replies[0]
    assert replies[1:] == ["session.updated"] * 8
    _assert_unhurt(baseline, during, attack_s)


RECURSIVE = {
    "type": "object",
    "properties": {"child": {"$ref": "#"}},
    "required": ["child"],
}


async def test_a_recursive_tool_schema_is_a_400_and_other_chats_are_served(
    nursery: trio.Nursery,
) -> None:
    # Issue 27 #2: a $ref cycle compiled lazily and failed the LLM's whole batch while
    # decoding (4 of 4 other users' chats got 500 with the attacker's text).
    port = await _server(nursery)
    tool = {"type": "function", "function": {"name": "tree", "parameters": RECURSIVE}}

    def attack(stop: threading.Event) -> None:
        for _ in range(3):
            status, body = _chat(port, ATTACKER, tools=[tool], tool_choice="required")
            assert status == 400
            assert body["error"]["param"] == "tools.0.function.parameters"
            assert "refer to themselves (# -> #)" in body["error"]["message"]

    during = await trio.to_thread.run_sync(_beside, port, attack, 6)
    assert len(during) == 6  # every normal chat 200 (asserted inside)


@pytest.mark.parametrize(
    ("fields", "param", "named"),
    [
        ({"seed": 2**70}, "seed", "less than or equal to 18446744073709551615"),
        ({"seed": -(2**70)}, "seed", "greater than or equal to -9223372036854775808"),
        ({"max_tokens": 10**9}, "max_tokens", "1e+09 is above this server's cap of 4096"),
        ({"max_completion_tokens": 5000}, "max_completion_tokens", "cap of 4096"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[" * 200_000},
                            }
                        ],
                    }
                ]
            },
            "messages.0.tool_calls.0.function.arguments",
            "arguments are nested deeper than 64 levels",
        ),
    ],
)
async def test_fields_out_of_range_are_400s_naming_them_beside_normal_chats(
    nursery: trio.Nursery, fields: dict[str, Any], param: str, named: str
) -> None:
    # Issue 27 #3-#5: seed 2**70 was a 500 ("Overflow when unpacking long long"),
    # arguments "[" * 200000 a 500 HTML RecursionError, max_tokens 10**9 accepted.
    port = await _server(nursery)

    def attack(stop: threading.Event) -> None:
        for _ in range(3):
            status, body = _chat(port, ATTACKER, **fields)
            assert status == 400, body
            assert body["error"]["param"] == param
            assert named in body["error"]["message"]

    during = await trio.to_thread.run_sync(_beside, port, attack, 4)
    assert len(during) == 4


def _metric(port: int, name: str) -> float:
    _, _, text = http_request(port, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def _open_endless_chat(port: int, source: str) -> socket.socket:
    """A streaming chat that never ends; returns its socket once the 200 is in."""
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock


class _LogCount(logging.Handler):
    """Sets ``done`` (a threading.Event) once ``count`` records contain ``text``."""

    def __init__(self, text: str, count: int) -> None:
        super().__init__()
        self.text, self.count = text, count
        self.done = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.count -= 1
            if self.count <= 0:
                self.done.set()

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)


async def test_one_client_holds_at_most_its_share_of_the_streams(nursery: trio.Nursery) -> None:
    # Issue 27 #3: 16 endless streaming chats took every slot of the voice chat; every
    # other request got 503 for the whole run.
    port = await _server(nursery, ENDLESS, max_streams=4)  # a client's share: 2
    disconnected = _LogCount("disconnected", 3)
    logging.getLogger("omnitrio.server").addHandler(disconnected)
    logging.getLogger("omnitrio.server").setLevel(logging.INFO)

    def attack_then_serve() -> None:
        held = [_open_endless_chat(port, ATTACKER) for _ in range(2)]
        try:
            status, body = _chat(port, ATTACKER)
            assert status == 429
            assert body["error"]["param"] == "max_streams_per_client"
            assert "max_streams_per_client=2" in body["error"]["message"]
            assert _metric(port, "omnitrio_client_streams_max") == 2
            assert _metric(port, "omnitrio_client_streams_limit") == 2
            assert _metric(port, 'omnitrio_refusals_total{reason="streams"}') == 1
            # Another client is served meanwhile (its answers are endless too: read a
            # little of one, then leave; its stream is freed and logged as disconnected).
            mine = _open_endless_chat(port, NORMAL)
            seen = b""
            while b"data: " not in seen:
                seen += mine.recv(4096)
            mine.close()
        finally:
            for sock in held:
                sock.close()

    await trio.to_thread.run_sync(attack_then_serve)
    # Each stream, its client gone, ends with a log line saying so.
    assert await trio.to_thread.run_sync(disconnected.wait, 10)


def _wav(bits_per_sample: int) -> bytes:
    data = b"\x01\x00" * 1600
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, bits_per_sample)
    return header + b"data" + struct.pack("<I", len(data)) + data


async def test_small_hostile_requests_get_clear_answers_beside_normal_chats(
    nursery: trio.Nursery,
) -> None:
    # Issue 27 #7 and the rest: a long /static/ path was a 500 (ENAMETOOLONG) with
    # ~12 KB of log; 413 was HTML; "bearer" was refused and a bare key accepted.
    port = await _server(nursery, max_message_bytes=64 * 1024)

    def attack(stop: threading.Event) -> None:
        for _ in range(3):
            status, _, body = http_request(port, "GET", "/static/" + "a/" * 3000, source=ATTACKER)
            assert status == 404, body[:200]

    during = await trio.to_thread.run_sync(_beside, port, attack, 4)
    assert len(during) == 4


async def test_the_bearer_scheme_is_case_insensitive_and_required(nursery: trio.Nursery) -> None:
    port = await _server(nursery, api_key="sekrit")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()

    def status_with(authorization: str) -> int:
        headers = {"Authorization": authorization}
        return http_request(port, "POST", "/v1/chat/completions", body, headers)[0]

    statuses = await trio.to_thread.run_sync(
        lambda: [status_with(a) for a in ("Bearer sekrit", "bearer sekrit", "sekrit", "Basic x")]
    )
    assert statuses == [200, 200, 401, 401]


async def test_a_realtime_frame_with_commas_inside_a_string_is_accepted(
    nursery: trio.Nursery,
) -> None:
    # Issue 27 #8: 48 KB of "1,2," inside one string was refused message_too_large:
    # the pre-check counted commas inside strings.
    port = await _server(nursery)
    item, truncate = COMMAS_ITEM, HUGE_TRUNCATE
    async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
        await ws.get_message()  # session.created
        await ws.send_message(json.dumps(item))
        assert json.loads(await ws.get_message())["type"] == "conversation.item.added"
        await ws.send_message(json.dumps(truncate))
        while (reply := json.loads(await ws.get_message()))["type"] != "error":
            assert reply["type"].startswith("conversation.item")
        error = reply["error"]
        assert error["param"] == "audio_end_ms"
        assert len(error["message"]) < 120  # not a 300-digit echo


async def test_a_burst_of_streaming_chats_gets_only_the_clients_share(
    nursery: trio.Nursery,
) -> None:
    # Found by the attack kit: 36 of one client's 64 streaming chats sent at once got a
    # 200 with a share of 32, because the stream opened only when the body started.
    port = await _server(nursery, ENDLESS, max_streams=4)  # a client's share: 2
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()

    def burst() -> list[bytes]:
        socks = [
            socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(ATTACKER, 0))
            for _ in range(8)
        ]
        try:
            for sock in socks:  # every request is in before any answer is read
                sock.sendall(head + body)
            return [sock.recv(12) for sock in socks]
        finally:
            for sock in socks:
                sock.close()

    statuses = await trio.to_thread.run_sync(burst)
    assert sorted(statuses) == [b"HTTP/1.1 200"] * 2 + [b"HTTP/1.1 429"] * 6
