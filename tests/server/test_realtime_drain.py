"""Realtime WebSocket sessions while the server drains, end to end: the server in this
process (its tasks can be counted), real WebSocket clients (trio-websocket), stopped by
SIGTERM. As a WebRTC call does (tests/server/test_calls_drain.py): an idle session is
closed at once with 1001 (going away), one answering is closed so once its answer's
``response.done`` has gone out, and one still answering at the hard stop is cut then."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
import trio_websocket

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config, count_tasks

T = TypeVar("T")
GRACE_S = 10.0
AT_ONCE_S = 2.0
"""An idle session's close comes within this (it takes milliseconds; the bound is loose
for a loaded machine, but far inside the grace period that held it before)."""


def _answer(steps: int, step_ms: float) -> list[dict[str, Any]]:
    """An answer of ``steps`` audio chunks, one each ``step_ms``."""
    return [
        {"steps": steps, "service_time_ms": step_ms},
        {"outputs_per_input": 0, "visible": "audio", "audio_samples": 480},
    ]


async def drained(
    stages: list[dict[str, Any]],
    grace_s: float,
    script: Callable[[str], Awaitable[tuple[T, float]]],
    max_streams: int = 4,
    wait_s: float = 0.0,
) -> tuple[T, float]:
    """Serve ``stages`` and run ``script(ws_url)``: it sends SIGTERM and returns (its
    result, ``trio.current_time()`` of the signal). Its result and how long after the
    signal ``serve`` returned, once it has returned SIGTERM and left no task behind."""
    config = chain_config(stages, max_streams=max_streams)
    if wait_s:  # pipeline.admission_wait_s: a response past max_streams waits for a slot
        waiting = config.pipeline.model_copy(update={"admission_wait_s": wait_s})
        config = config.model_copy(update={"pipeline": waiting})
    settings = ServerSettings(port=0, grace_period_s=grace_s, max_streams_per_client=4)
    tasks_before = count_tasks()
    stopped: list[int | None] = []

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        stopped.append(await serve(config, settings, task_status=task_status))

    with trio.fail_after(grace_s + 30):  # a hang guard
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run)
            url = binds[0].replace("http", "ws") + "/v1/realtime"
            result, signalled_at = await script(url)
        returned_s = trio.current_time() - signalled_at
    assert stopped == [signal.SIGTERM]
    assert count_tasks() == tasks_before
    return result, returned_s


def sigterm() -> float:
    """SIGTERM to this process (the server drains): when it was sent."""
    os.kill(os.getpid(), signal.SIGTERM)
    return trio.current_time()


async def until(ws: trio_websocket.WebSocketConnection, kind: str) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(await ws.get_message())
        if event["type"] == kind:
            return event


async def closing(
    ws: trio_websocket.WebSocketConnection,
) -> tuple[list[dict[str, Any]], int | None, str]:
    """The events still sent, then the close's code and reason (1006: the connection
    was dropped without a close frame)."""
    events: list[dict[str, Any]] = []
    try:
        while True:
            events.append(json.loads(await ws.get_message()))
    except trio_websocket.ConnectionClosed as closed:
        return events, closed.reason.code, closed.reason.reason or ""


async def test_an_idle_session_is_closed_with_1001_at_once_on_a_drain() -> None:
    """SIGTERM with an idle session up (10 s of grace): the session is closed at once
    with 1001, saying the server drains, and the server stops without waiting for the
    grace period. (Before, the session held the stop for the whole grace period and was
    then cut without a close frame.)"""

    async def script(url: str) -> tuple[tuple[float, int | None, str], float]:
        async with trio_websocket.open_websocket_url(url) as ws:
            await until(ws, "session.created")
            signalled_at = sigterm()
            _, code, reason = await closing(ws)
            return (trio.current_time() - signalled_at, code, reason), signalled_at

    (closed_s, code, reason), returned_s = await drained(_answer(4, 1.0), GRACE_S, script)
    assert (code, "draining" in reason) == (1001, True), (code, reason)
    assert closed_s < AT_ONCE_S, closed_s
    assert returned_s < GRACE_S / 2, returned_s


async def test_a_session_answering_on_a_drain_finishes_its_answer_then_is_closed() -> None:
    """SIGTERM while a session's answer of about 6 s is under way: the answer goes out
    whole (``response.done`` completed), then the session is closed with 1001 and the
    server stops within the grace period. A second session, idle, is closed at once,
    long before the answer is done."""

    async def script(url: str) -> tuple[tuple[Any, ...], float]:
        async with (
            trio_websocket.open_websocket_url(url) as talking,
            trio_websocket.open_websocket_url(url) as idle,
        ):
            await until(idle, "session.created")
            await until(talking, "session.created")
            await talking.send_message(json.dumps({"type": "response.create"}))
            await until(talking, "response.output_audio.delta")
            signalled_at = sigterm()
            _, idle_code, _ = await closing(idle)
            idle_closed_s = trio.current_time() - signalled_at
            events, code, _ = await closing(talking)
            talking_closed_s = trio.current_time() - signalled_at
            result = (idle_code, idle_closed_s, events, code, talking_closed_s)
            return result, signalled_at

    stages = _answer(60, 100.0)  # 6 s of answer: "at once" and "once it is out" 4 s apart
    result, returned_s = await drained(stages, GRACE_S, script)
    idle_code, idle_closed_s, events, code, talking_closed_s = result
    types = [event["type"] for event in events]
    assert idle_code == 1001, idle_code
    assert idle_closed_s < AT_ONCE_S, idle_closed_s
    assert "response.done" in types, types
    assert types[-1] == "response.done", types  # the close came after it
    assert events[-1]["response"]["status"] == "completed", events[-1]
    assert code == 1001, code
    assert idle_closed_s < talking_closed_s < GRACE_S, (idle_closed_s, talking_closed_s)
    assert returned_s < GRACE_S, returned_s


async def test_a_response_waiting_for_admission_on_a_drain_is_refused_not_started() -> None:
    """One slot, taken by a 6 s answer; a second session's response waits for it
    (``admission_wait_s`` 30 s). SIGTERM: the waiting response ends at once, failed as
    the server drains with a retry hint, and its session is closed; it is not admitted
    when the answer ends, to start a new answer the hard stop would cut."""

    async def script(url: str) -> tuple[tuple[Any, ...], float]:
        async with (
            trio_websocket.open_websocket_url(url) as talking,
            trio_websocket.open_websocket_url(url) as queued,
        ):
            await until(talking, "session.created")
            await until(queued, "session.created")
            await talking.send_message(json.dumps({"type": "response.create"}))
            await until(talking, "response.output_audio.delta")
            await queued.send_message(json.dumps({"type": "response.create"}))
            await until(queued, "response.created")
            await trio.sleep(0.3)  # it waits for the slot
            signalled_at = sigterm()
            done = await until(queued, "response.done")
            done_s = trio.current_time() - signalled_at
            events, code, _ = await closing(queued)
            await closing(talking)
            return (done, done_s, events, code), signalled_at

    result, returned_s = await drained(_answer(60, 100.0), GRACE_S, script, 1, 30.0)
    done, done_s, events, code = result
    response = done["response"]
    assert response["status"] == "failed", response
    assert "drain" in json.dumps(response["status_details"]), response
    assert done_s < AT_ONCE_S, done_s  # not held until the answer before it ends (~6 s)
    assert not any(e["type"] == "response.output_audio.delta" for e in events), events
    assert code == 1001, code
    assert returned_s < GRACE_S, returned_s


async def test_a_session_still_answering_at_the_hard_stop_is_cut_then() -> None:
    """SIGTERM with 1 s of grace while a session's answer has 100 s to go: the answer
    goes on through the grace period, then the session is cut (no ``response.done``)
    and the server returns soon after."""
    grace_s = 1.0

    async def script(url: str) -> tuple[tuple[list[str], float], float]:
        async with trio_websocket.open_websocket_url(url) as ws:
            await until(ws, "session.created")
            await ws.send_message(json.dumps({"type": "response.create"}))
            await until(ws, "response.output_audio.delta")
            signalled_at = sigterm()
            events, _, _ = await closing(ws)
            types = [event["type"] for event in events]
            return (types, trio.current_time() - signalled_at), signalled_at

    (types, ended_s), returned_s = await drained(_answer(1000, 100.0), grace_s, script)
    assert "response.done" not in types, types
    assert types.count("response.output_audio.delta") >= 3, types  # it went on in the grace
    # cut at the hard stop, not before; the bound after it only catches a hang (the
    # pipeline's own stop, 2 s at most here, follows the cut)
    assert grace_s * 0.9 < ended_s < grace_s + 3, ended_s
    assert grace_s * 0.9 < returned_s < grace_s + 4, returned_s
