"""The client side of the thread-driven baselines: an unbounded queue per request.

A baseline's own thread hands each request's items to trio with ``deliver``;
the request's task records them with ``record_arrivals``. ``None`` ends the
request, an exception fails it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from omnitrio import AudioChunk, TextDelta, VisibleItem

from ._target import TargetError, Timeline

Delivery = VisibleItem | BaseException | None


def deliver(
    token: trio.lowlevel.TrioToken, send: trio.MemorySendChannel[Delivery], item: Delivery
) -> None:
    """Hand ``item`` to the request's task (from any thread; never blocks)."""
    token.run_sync_soon(_send_quietly, send.send_nowait, item)


async def record_arrivals(receive: trio.MemoryReceiveChannel[Delivery], timeline: Timeline) -> bool:
    """Record text and audio arrivals until the request ends: True when it completed."""
    with receive:
        async for item in receive:
            if item is None:
                return True
            if isinstance(item, BaseException):
                raise TargetError(str(item))
            if isinstance(item, TextDelta):
                timeline.text()
            elif isinstance(item, AudioChunk):
                timeline.audio_chunk(item.duration_s)
                await timeline.consume(item.duration_s)
    return False


async def follow(
    receive: trio.MemoryReceiveChannel[Delivery],
    timeline: Timeline,
    forget: Callable[[bool], None],
) -> None:
    """``record_arrivals``, then ``forget(completed)`` however it ended (an abandoned or
    failed request is the baseline's to abort)."""
    completed = False
    try:
        completed = await record_arrivals(receive, timeline)
    finally:
        forget(completed)


def _send_quietly(send: Callable[[Delivery], None], item: Delivery) -> None:
    # A client that has gone closed its channel; the abort is on its way to the stages.
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        send(item)
