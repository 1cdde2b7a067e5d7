"""What reaches a draining server is refused with its 503, end to end: the server in this
process, stopped by SIGTERM, and a real HTTP/1.1 client on a raw socket whose request
was still arriving when the signal came (its headers sent before, its body after). The
drain's refusal says the server drains (``Draining``) and never names ``max_streams``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio_websocket

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config

GRACE_S = 10.0
ANSWER = [
    {"steps": 4, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 480},
]


async def _response(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off ``stream`` (its body up to Content-Length, or to EOF)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, f"the server closed before answering: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(body) < length:
        chunk = await stream.receive_some()
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


async def _closed_by_server(ws: trio_websocket.WebSocketConnection) -> int | None:
    """Until the server closes ``ws``, an idle Realtime session (it does so at once when
    it drains, with 1001): the close's code."""
    try:
        while True:
            await ws.get_message()
    except trio_websocket.ConnectionClosed as closed:
        return closed.reason.code


async def _refused_while_arriving(
    path: str, content_type: str, body: bytes
) -> tuple[int, dict[str, str], bytes, float]:
    """Serve; send ``path``'s headers and half of ``body``; SIGTERM; once the drain has
    begun (the server closed an idle Realtime session), the rest of ``body``. The
    response, and how long after the signal ``serve`` returned."""
    config = chain_config(ANSWER, max_streams=4)
    settings = ServerSettings(port=0, grace_period_s=GRACE_S)
    stopped: list[int | None] = []

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        stopped.append(await serve(config, settings, task_status=task_status))

    with trio.fail_after(GRACE_S + 30):  # a hang guard
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run)
            port = int(binds[0].rsplit(":", 1)[1])
            idle = await trio_websocket.connect_websocket_url(
                nursery, binds[0].replace("http", "ws") + "/v1/realtime"
            )
            await idle.get_message()  # session.created
            arriving = await trio.open_tcp_stream("127.0.0.1", port)
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            half = len(body) // 2
            await arriving.send_all(head + body[:half])
            os.kill(os.getpid(), signal.SIGTERM)
            signalled_at = trio.current_time()
            assert await _closed_by_server(idle) == 1001  # the drain has begun
            await arriving.send_all(body[half:])
            status, headers, answer = await _response(arriving)
            await arriving.aclose()
        returned_s = trio.current_time() - signalled_at
    assert stopped == [signal.SIGTERM]
    return status, headers, answer, returned_s


def _says_it_drains(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 503, (status, body)
    error = json.loads(body)["error"]
    assert "the server is draining" in error["message"], error
    assert "max_streams" not in error["message"], error
    assert headers.get("retry-after") == "1", headers


async def test_a_chat_request_still_arriving_when_the_drain_began_gets_the_503() -> None:
    """A chat completion whose body was still coming when SIGTERM came: 503 saying the
    server drains (Retry-After), and the server stops at once after it, not at the end
    of the grace period."""
    request = {"model": "test", "messages": [{"role": "user", "content": "hello " * 200}]}
    body = json.dumps(request).encode()
    status, headers, answer, returned_s = await _refused_while_arriving(
        "/v1/chat/completions", "application/json", body
    )
    _says_it_drains(status, headers, answer)
    assert returned_s < GRACE_S / 2, returned_s


async def _offer() -> str:
    """A real WebRTC offer (aiortc's, as a browser's: audio and the events channel)."""
    from tests.webrtc_support import Caller

    caller = Caller("http://127.0.0.1:1")
    try:
        await caller.pc.setLocalDescription(await caller.pc.createOffer())
        return str(caller.pc.localDescription.sdp)
    finally:
        await caller.close()


async def test_a_call_still_arriving_when_the_drain_began_gets_the_503() -> None:
    """A WebRTC call (``POST /v1/realtime/calls``, a real offer) whose offer was still
    coming when SIGTERM came: 503 saying the server drains, no call is made, and the
    server stops at once after it."""
    pytest.importorskip("aiortc")
    from tests.webrtc_support import run_caller

    make: Callable[[], Awaitable[Any]] = _offer
    offer = await trio.to_thread.run_sync(run_caller, make)
    status, headers, answer, returned_s = await _refused_while_arriving(
        "/v1/realtime/calls", "application/sdp", offer.encode()
    )
    _says_it_drains(status, headers, answer)
    assert returned_s < GRACE_S / 2, returned_s
