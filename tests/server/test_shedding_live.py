"""Overload after admission on a real server (issue 22, ``docs/design.md``, "Admission"):
a stage slows down mid-run, the runtime sheds the newest streams it can no longer
carry in real time, each shed client gets a typed error naming why, no stream hangs,
and ``/metrics`` counts the shed.

The slowdown is the synthetic stage's fault (``slowdown`` x its step cost from
``slowdown_after_s`` after its first step); the test waits on the streams' ends, never
sleeps, and asserts on what the server reported, not on timing."""

from __future__ import annotations

import json
import socket

import trio

from tests.conftest import serve_chain

# b makes 20 ms of audio per stream-step and costs 1 ms + 4 ms per stream in the batch:
# 4 streams keep real time (20 / 17 ms); 1 s after its first step it becomes 4x slower
# (20 / 68 ms with 4: far behind), and one stream is all it then keeps in real time.
STAGES: list[dict[str, object]] = [
    {"steps": 150, "visible_every": 0},
    {
        "outputs_per_input": 0,
        "visible": "audio",
        "audio_samples": 320,
        "service_time_ms": 1.0,
        "per_stream_ms": 4.0,
        "slowdown": 4.0,
        "slowdown_after_s": 1.0,
        "slowdown_for_s": 3600.0,
    },
]
NUM_STREAMS = 4


def _open(port: int, max_tokens: int | None = None) -> socket.socket:
    """A streaming chat, its 200 read; the rest is read by ``_outcome``."""
    chat: dict[str, object] = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
    }
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens  # the synthetic stages' step count
    body = json.dumps(chat).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock


def _outcome(sock: socket.socket) -> dict[str, object]:
    """Read the event stream to its end: ``{"done": True}`` or the error it ended with.
    (The socket's timeout bounds a hang: it would fail the test, not stall it.)"""
    with sock, sock.makefile("rb") as reader:
        for line in reader:
            if line == b"data: [DONE]\n":
                return {"done": True}
            if line.startswith(b"data: {") and b'"error"' in line:
                error = json.loads(line[6:])["error"]
                assert isinstance(error, dict)
                return error
    raise AssertionError("the stream ended with neither [DONE] nor an error")


def _metric(port: int, name: str) -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


async def test_a_stage_that_slows_down_sheds_the_newest_streams_with_a_typed_error(
    nursery: trio.Nursery,
) -> None:
    port = await serve_chain(nursery, STAGES, 8, max_streams_per_client=8)
    outcomes: list[dict[str, object]] = [{} for _ in range(NUM_STREAMS)]
    with trio.fail_after(120):  # none hangs (each socket read is bounded too)
        # One short stream completes first: b learns its audio per step from it (the
        # runtime sheds only on a yield learned from completed streams).
        short = await trio.to_thread.run_sync(_open, port, 20)
        assert await trio.to_thread.run_sync(_outcome, short) == {"done": True}
        socks = [await trio.to_thread.run_sync(_open, port) for _ in range(NUM_STREAMS)]

        async def read(index: int) -> None:
            outcomes[index] = await trio.to_thread.run_sync(_outcome, socks[index])

        async with trio.open_nursery() as readers:
            for index in range(NUM_STREAMS):
                readers.start_soon(read, index)
    shed = [i for i, outcome in enumerate(outcomes) if "done" not in outcome]
    assert shed, f"nothing was shed: {outcomes}"
    # Newest first: the shed streams are the last ones opened, the oldest is kept.
    assert shed == list(range(NUM_STREAMS - len(shed), NUM_STREAMS)), outcomes
    for index in shed:
        error = outcomes[index]
        assert error["type"] == "server_error"
        message = str(error["message"])
        assert "was shed to keep the other streams in real time" in message, message
        assert "stage 'b' slowed to" in message, message
    shed_total = await trio.to_thread.run_sync(
        _metric, port, 'omnitrio_streams_total{outcome="shed"}'
    )
    assert shed_total == len(shed)
    completed = await trio.to_thread.run_sync(
        _metric, port, 'omnitrio_streams_total{outcome="completed"}'
    )
    assert completed == 1 + NUM_STREAMS - len(shed)
