"""An idle HTTP/1.1 keep-alive connection does not hold the server: end to end, the
server in this process and a raw-socket client that did ``GET /health`` and keeps its
socket open. On SIGTERM the server closes it at once and ``serve`` returns long before
the grace period ends; without a drain it is closed after hypercorn's keep-alive
timeout (5 s)."""

from __future__ import annotations

import os
import signal

import trio

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config

GRACE_S = 10.0
KEEP_ALIVE_S = 5.0  # hypercorn's default; omnitrio does not change it
ANSWER = [{"steps": 1, "service_time_ms": 1.0}]
REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"


async def _health(stream: trio.SocketStream) -> None:
    """Send ``GET /health`` and read its whole response (Content-Length); keep the socket."""
    await stream.send_all(REQUEST)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = await stream.receive_some()
        assert chunk, body
        body += chunk


async def _until_eof(stream: trio.SocketStream) -> None:
    """Until the server closes ``stream`` (EOF, or a reset); it sends nothing before."""
    try:
        chunk = await stream.receive_some()
    except trio.BrokenResourceError:  # a reset is a close too
        return
    assert chunk == b"", chunk


async def test_an_idle_keep_alive_connection_is_closed_at_once_on_a_drain() -> None:
    """SIGTERM with 10 s of grace: the idle connection gets EOF and ``serve`` returns
    within 3 s (before the fix both waited for the hard stop, 10 s)."""
    settings = ServerSettings(port=0, grace_period_s=GRACE_S)
    stopped: list[int | None] = []
    closed_s: list[float] = []

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        stopped.append(await serve(chain_config(ANSWER), settings, task_status=task_status))

    with trio.fail_after(GRACE_S + 30):  # a hang guard
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run)
            port = int(binds[0].rsplit(":", 1)[1])
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await _health(client)
            os.kill(os.getpid(), signal.SIGTERM)
            signalled_at = trio.current_time()
            await _until_eof(client)
            closed_s.append(trio.current_time() - signalled_at)
            await client.aclose()
        returned_s = trio.current_time() - signalled_at
    assert stopped == [signal.SIGTERM]
    assert closed_s[0] < 3.0, closed_s
    assert returned_s < 3.0, returned_s


async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout() -> None:
    """No signal: the idle connection gets EOF about 5 s after its response (before the
    fix it stayed open for as long as the client liked)."""
    settings = ServerSettings(port=0, grace_period_s=1.0)

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        await serve(chain_config(ANSWER), settings, task_status=task_status)

    with trio.fail_after(KEEP_ALIVE_S + 30):  # a hang guard
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run)
            port = int(binds[0].rsplit(":", 1)[1])
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await _health(client)
            answered_at = trio.current_time()
            with trio.move_on_after(KEEP_ALIVE_S + 10):
                await _until_eof(client)
            idle_s = trio.current_time() - answered_at
            await client.aclose()
            nursery.cancel_scope.cancel()
    assert KEEP_ALIVE_S - 0.5 < idle_s < KEEP_ALIVE_S + 3.0, idle_s
