"""Idle Realtime sessions are closed sooner while the server is near its connection
limit (omnitrio/server/_idle_sessions.py; issue 42, attack 8)."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

from omnitrio.server._idle_sessions import IdleSessions
from tests.server.test_client_totals import PROBE, _serve, _session


async def _alive(ws: trio_websocket.WebSocketConnection) -> bool:
    """Whether the session still answers (the probe's error comes back)."""
    try:
        await ws.send_message(PROBE)
        with trio.fail_after(5):
            while json.loads(await ws.get_message())["type"] != "error":
                pass
    except trio_websocket.ConnectionClosed:
        return False
    return True


async def _close_code(ws: trio_websocket.WebSocketConnection) -> int | None:
    with trio.fail_after(10):
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            while True:
                await ws.get_message()
    return None if closed.value.reason is None else closed.value.reason.code


async def test_idle_sessions_are_closed_sooner_only_near_the_connection_limit(
    nursery: trio.Nursery,
) -> None:
    # 10 connections: crowded at 9, calm again at 7. Idle 0.5 s on a crowded server
    # ends a session, the longest idle first, until the server is calm.
    url = await _serve(
        nursery, max_connections=10, max_connections_per_client=20, crowded_idle_s=0.5
    )
    async with _session(url) as a, _session(url) as b, _session(url) as c:
        few = (a, b, c)
        for ws in few:
            await ws.get_message()  # session.created
        await trio.sleep(1.0)  # idle twice as long, but the server is far from full
        assert await _alive(a)
        assert await _alive(b)
        await trio.sleep(0.3)
        assert await _alive(c)  # idle since 0.3 s after a and b
        await trio.sleep(0.3)
        async with (
            _session(url) as d,
            _session(url) as e,
            _session(url) as f,
            _session(url) as g,
            _session(url) as h,
            _session(url) as i,
        ):
            # 9 open: a and b (idle longest) are closed, which calms the server.
            started = trio.current_time()
            assert [await _close_code(ws) for ws in (a, b)] == [1013, 1013]
            assert trio.current_time() - started < 3
            await trio.sleep(1.0)  # the others idle on, the server is calm
            assert all([await _alive(ws) for ws in (c, d, e, f, g, h, i)])


async def test_the_crowding_moves_every_waiting_deadline() -> None:
    idle = IdleSessions(crowded_idle_s=0.2)
    with idle.waiting() as waiting:
        idle.set_crowded(True)
        await trio.sleep_forever()
    assert waiting.cancelled_caught
    with trio.move_on_after(0.4) as outer:
        with idle.waiting() as waiting:
            idle.set_crowded(False)  # no longer crowded: no deadline
            await trio.sleep_forever()
    assert outer.cancelled_caught
    assert not waiting.cancelled_caught
