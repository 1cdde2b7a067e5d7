"""aiortc's asyncio loop on a thread of its own, and trio's way to await work there.

aiortc runs on asyncio; the server runs on trio. One ``AsyncioThread`` per server runs
one asyncio event loop on a daemon thread for every call's peer connection. A trio task
calls ``run(fn, ...)``: the coroutine runs on the asyncio loop and the trio task waits
on a ``trio.Event`` that the coroutine's completion sets through the trio token (a
thread-safe, non-blocking hand-over). Nothing is queued across the bridge: each call is
one coroutine awaited by one trio task, so the trio side pulls at its own pace and the
asyncio side never pushes into trio. A trio cancel cancels the asyncio task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

logger = logging.getLogger(__name__)

T = TypeVar("T")

STOP_TIMEOUT_S = 2.0
"""``stop`` waits this long for the loop's tasks to end before it leaves the thread."""


class BridgeClosed(RuntimeError):
    """The asyncio thread has stopped: no more WebRTC work can run."""


class AsyncioThread:
    """One asyncio event loop on a daemon thread (see the module docstring)."""

    def __init__(self, name: str = "omnitrio-webrtc") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            if tasks:
                gathered = asyncio.gather(*tasks, return_exceptions=True)
                self._loop.run_until_complete(asyncio.wait_for(gathered, STOP_TIMEOUT_S))
            # aiortc resolves candidates' names in the loop's default executor: its
            # threads end with the loop.
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        except Exception:
            logger.exception("the WebRTC asyncio loop failed while stopping")
        finally:
            self._loop.close()

    async def run(self, fn: Callable[..., Awaitable[T]], *args: object) -> T:
        """``await fn(*args)`` on the asyncio loop, from trio."""
        if self._stopped:
            raise BridgeClosed("the WebRTC loop has stopped")
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        async def call() -> T:
            return await fn(*args)

        def wake(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):  # trio has ended: nobody waits
                token.run_sync_soon(done.set, idempotent=True)

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(call(), self._loop)
        future.add_done_callback(wake)
        try:
            await done.wait()
        finally:
            if not future.done():
                future.cancel()  # cancels the asyncio task too
        return future.result()

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the asyncio loop soon (thread-safe; nothing is awaited)."""
        if not self._stopped:
            self._loop.call_soon_threadsafe(fn)

    async def stop(self) -> None:
        """Stop the loop (its tasks are cancelled) and wait for the thread to end."""
        if self._stopped:
            return
        self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        with trio.move_on_after(STOP_TIMEOUT_S + 1.0):
            await trio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
