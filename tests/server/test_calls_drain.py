"""WebRTC calls live while the server drains, end to end: real aiortc callers
(tests/webrtc_support.py) in this process, the server in this process too (its tasks
and threads can be counted), stopped by SIGTERM while a call's answer plays."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import trio

from omnitrio.server import ServerSettings, serve
from omnitrio.server._calls import CLOSE_TIMEOUT_S, FLUSH_TIMEOUT_S
from tests.conftest import chain_config
from tests.server.test_calls import TURN_TIMEOUT_S, ask_a_text_turn
from tests.webrtc_support import RATE_HZ, Caller, run_caller

T = TypeVar("T")


def _answer(steps: int) -> list[dict[str, Any]]:
    """An answer of ``steps`` tenths of a second of audio, made far faster than real time."""
    return [
        {"steps": steps, "service_time_ms": 1.0},
        {"outputs_per_input": 0, "visible": "audio", "audio_samples": 1600},
    ]


PLAYOUT_S = 0.5  # the answer is held back to the track's real time (still in flight)
GRACE_S = 6.0


def _tasks() -> int:
    """Every trio task in this run (the test's own included)."""
    count, todo = 0, [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += 1
        todo.extend(t for n in task.child_nurseries for t in n.child_tasks)
    return count


async def _drained(
    steps: int, grace_s: float, script: Callable[[str], Awaitable[tuple[T, float]]]
) -> tuple[T, float]:
    """Serve (an answer of ``steps``) and run ``script(base_url)`` on a caller's thread: it
    sends SIGTERM and returns (its result, ``time.monotonic()`` of the signal). Its result
    and how long after the signal ``serve`` returned, once it has returned SIGTERM and left
    no task or thread behind."""
    config = chain_config(_answer(steps), max_streams=4)
    settings = ServerSettings(port=0, grace_period_s=grace_s, webrtc_playout_s=PLAYOUT_S)
    threads_before = set(threading.enumerate())
    tasks_before = _tasks()
    stopped: list[int | None] = []

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        stopped.append(await serve(config, settings, task_status=task_status))

    with trio.fail_after(grace_s + 2 * CLOSE_TIMEOUT_S + 30):  # a hang guard
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run)
            result, signalled_at = await trio.to_thread.run_sync(
                run_caller, lambda: script(binds[0])
            )
        returned_s = time.monotonic() - signalled_at
    assert stopped == [signal.SIGTERM]
    assert _tasks() == tasks_before
    with trio.fail_after(5):  # aiortc's thread is joined; its executor's may trail
        while _started_since(threads_before):  # noqa: ASYNC110 (threads: nothing to await)
            await trio.sleep(0.05)
    return result, returned_s


async def _answering(caller: Caller) -> float:
    """Ask ``caller``'s call for an answer; once it plays, SIGTERM: when it was sent."""
    await ask_a_text_turn(caller)
    await caller.wait_type("output_audio_buffer.started", TURN_TIMEOUT_S)
    os.kill(os.getpid(), signal.SIGTERM)  # the server drains, this call live
    return time.monotonic()


def _closing(caller: Caller) -> asyncio.Event:
    """Set once the call's events channel has closed (the server ended the call)."""
    closed = asyncio.Event()
    caller.channel.once("close", closed.set)
    return closed


def _loud_s(audio: bytes | bytearray) -> float:
    """Seconds of the answer's tone in ``audio`` (PCM16 at RATE_HZ)."""
    return float((np.abs(np.frombuffer(bytes(audio), "<i2")) > 200).sum() / RATE_HZ)


async def test_a_call_answering_when_the_server_drains_finishes_its_answer_then_ends() -> None:
    """SIGTERM while a call's answer plays: the answer plays out whole (response.done
    completed, output_audio_buffer.stopped, every second of its audio on the track)
    within the grace period, the call then ends, the server returns within the grace
    period plus the calls' close bound, and no task or thread it started is left."""

    async def script(base_url: str) -> tuple[tuple[Caller, float], float]:
        caller = Caller(base_url)
        try:
            signalled_at = await _answering(caller)
            closed = _closing(caller)  # the answer plays: the call is up until it is out
            await caller.wait_type("response.done", GRACE_S)
            await caller.wait_type("output_audio_buffer.stopped", GRACE_S)
            waited_s = time.monotonic() - signalled_at
            # the server ends the call itself, once it is quiet (not the caller's hang-up)
            await asyncio.wait_for(closed.wait(), FLUSH_TIMEOUT_S + CLOSE_TIMEOUT_S)
            return (caller, waited_s), signalled_at
        finally:
            await caller.close()

    (caller, waited_s), returned_s = await _drained(30, GRACE_S, script)  # 3 s of answer
    done = next(e for e in caller.events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", done
    assert _loud_s(caller.audio) > 2.5, "the answer did not play out whole on the track"
    assert waited_s < GRACE_S, waited_s
    # not held to the hard stop: back within the grace period, and soon after the call ended
    assert returned_s < GRACE_S, returned_s
    assert returned_s < waited_s + 2 * CLOSE_TIMEOUT_S + 1, (returned_s, waited_s)


async def test_an_idle_call_ends_at_once_while_another_still_answers() -> None:
    """SIGTERM with two calls up, one answering and one idle: the idle call is ended at
    once (its events channel closed within the close bound, long before the answer is
    out), not held for the grace period; the other's answer still completes."""

    async def script(base_url: str) -> tuple[tuple[float, float, dict[str, Any]], float]:
        talking, idle = Caller(base_url), Caller(base_url)
        try:
            await idle.connect()
            await idle.wait_type("session.created", TURN_TIMEOUT_S)
            idle_closed = _closing(idle)
            signalled_at = await _answering(talking)
            await asyncio.wait_for(idle_closed.wait(), GRACE_S)
            idle_ended_s = time.monotonic() - signalled_at
            done = await talking.wait_type("response.done", GRACE_S)
            done_s = talking.time_of(done) - signalled_at
            await talking.wait_type("output_audio_buffer.stopped", GRACE_S)
            return (idle_ended_s, done_s, done), signalled_at
        finally:
            await talking.close()
            await idle.close()

    (idle_ended_s, done_s, done), returned_s = await _drained(30, GRACE_S, script)
    # at once: its close is the flush and the peer's close (0.5 s + at most 1 s); the
    # bound is loose for a loaded machine, and still far inside the grace period
    assert idle_ended_s < GRACE_S / 2, idle_ended_s
    assert idle_ended_s < done_s, (idle_ended_s, done_s)
    assert done["response"]["status"] == "completed", done
    assert returned_s < GRACE_S + 2 * CLOSE_TIMEOUT_S + 1, returned_s


async def test_a_call_still_answering_at_the_hard_stop_is_cancelled_then() -> None:
    """SIGTERM with 2 s of grace while a call's answer has 10 s to play: the answer plays
    on through the grace period (about its two seconds of audio reach the track after the
    signal; 2 s, not 1, leaves a loaded machine room under the bound), then the call is
    cut (no response.done) and the server returns within the grace period plus the
    calls' close bound, nothing left behind."""
    grace_s = 2.0

    async def script(base_url: str) -> tuple[tuple[float, float, list[str]], float]:
        caller = Caller(base_url)
        try:
            closed = _closing(caller)
            signalled_at = await _answering(caller)
            heard_before = len(caller.audio)
            await asyncio.wait_for(closed.wait(), grace_s + 2 * CLOSE_TIMEOUT_S + 1)
            ended_s = time.monotonic() - signalled_at
            after_s = _loud_s(caller.audio[heard_before:])
            return (ended_s, after_s, caller.types()), signalled_at
        finally:
            await caller.close()

    (ended_s, after_s, types), returned_s = await _drained(100, grace_s, script)
    assert "response.done" not in types, types
    assert after_s > 0.6 * grace_s, after_s  # the answer went on playing in the grace
    # cut at the hard stop, then the peer's close (at most 1 s) and the channel's close
    # reaching the caller: the bound after it is loose for a loaded machine
    assert grace_s * 0.9 < ended_s < grace_s + CLOSE_TIMEOUT_S + 1.5, ended_s
    assert grace_s * 0.9 < returned_s < grace_s + 2 * CLOSE_TIMEOUT_S + 1, returned_s


def _started_since(before: set[threading.Thread]) -> set[threading.Thread]:
    """Threads alive now that were not in ``before``, but trio's own idle worker threads
    (kept for reuse ten seconds after ``trio.to_thread``)."""
    return {t for t in threading.enumerate() if t not in before and not t.name.startswith("Trio")}
