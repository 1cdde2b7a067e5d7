"""The server's two per-message hand-overs on the trio thread: a WebSocket message to the
app (``LimitedWSStream._put_to_app``) and a server event to the connection's writer
(``RealtimeConnection._queue``). With room in the channel (the usual case: a live
session's 20 ms audio appends, its audio deltas), each hands over at once, without a
cancel scope or a checkpoint; a full channel still waits, bounded as before."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from omnitrio.realtime import ServerEvent
from omnitrio.server._realtime import RealtimeConnection, _ClientTooSlow
from omnitrio.server._ws_stream import LimitedWSStream


def _ws_stream() -> LimitedWSStream:
    stream = LimitedWSStream.__new__(LimitedWSStream)  # only what _put_to_app reads
    stream._app_returned = False
    stream._puts = set()
    return stream


def _connection(capacity: int, send_timeout_s: float) -> RealtimeConnection:
    settings = SimpleNamespace(outbound_capacity=capacity, send_timeout_s=send_timeout_s)
    state = cast(Any, SimpleNamespace(settings=settings))
    return RealtimeConnection(state, cast(Any, None), cast(Any, None), "client")


async def test_a_message_with_room_reaches_the_app_without_a_checkpoint() -> None:
    stream = _ws_stream()
    send, receive = trio.open_memory_channel[object](2)
    with trio.CancelScope() as scope:
        scope.cancel()  # a checkpoint here would raise Cancelled
        await stream._put_to_app(send.send, {"type": "websocket.receive", "text": "a"})
        await stream._put_to_app(send.send, {"type": "websocket.receive", "text": "b"})
    assert not scope.cancelled_caught
    assert [receive.receive_nowait()["text"], receive.receive_nowait()["text"]] == ["a", "b"]  # type: ignore[index]


async def test_a_message_to_a_full_app_channel_waits_until_the_app_takes_one() -> None:
    stream = _ws_stream()
    send, receive = trio.open_memory_channel[object](1)
    await stream._put_to_app(send.send, "first")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream._put_to_app, send.send, "second")
        await trio.testing.wait_all_tasks_blocked()
        assert len(stream._puts) == 1  # waiting, in a scope that app_send(None) cancels
        assert receive.receive_nowait() == "first"
    assert receive.receive_nowait() == "second"
    assert not stream._puts


async def test_a_message_after_the_app_returned_is_dropped() -> None:
    stream = _ws_stream()
    stream._app_returned = True
    send, receive = trio.open_memory_channel[object](1)
    await stream._put_to_app(send.send, "late")
    with pytest.raises(trio.WouldBlock):
        receive.receive_nowait()


async def test_a_server_event_with_room_is_queued_without_a_checkpoint() -> None:
    connection = _connection(capacity=4, send_timeout_s=10.0)
    events = [ServerEvent("response.output_audio.delta", {"n": n}) for n in range(3)]
    with trio.CancelScope() as scope:
        scope.cancel()
        for event in events:
            await connection._queue(event)
    assert not scope.cancelled_caught
    assert [connection._outbound.receive_nowait() for _ in events] == events


async def test_a_client_that_leaves_the_queue_full_is_too_slow() -> None:
    connection = _connection(capacity=1, send_timeout_s=0.05)
    await connection._queue(ServerEvent("a"))
    with pytest.raises(_ClientTooSlow):
        await connection._queue(ServerEvent("b"))


async def test_a_server_event_waits_for_room_within_the_send_timeout() -> None:
    connection = _connection(capacity=1, send_timeout_s=10.0)
    await connection._queue(ServerEvent("a"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection._queue, ServerEvent("b"))
        await trio.testing.wait_all_tasks_blocked()
        assert connection._outbound.receive_nowait() == ServerEvent("a")
    assert connection._outbound.receive_nowait() == ServerEvent("b")
