"""An asyncio loop on a thread of its own: the vllm-omni model's orchestrator and API
server each run one, as vllm-omni's do."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

STOP_RETRY_S = 0.1  # how often stopping a loop cancels its task again


class ThreadLoop:
    """An asyncio loop on a thread of its own, running ``main`` until stopped."""

    def __init__(self, name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._main = main
        self._ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def call(self, function: Callable[..., object], *args: object) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(function, *args)

    def stop(self) -> None:
        # Cancel every task of the loop until the thread ends. On Python 3.11,
        # ``asyncio.wait_for`` can swallow a cancellation that arrives as its inner wait
        # completes (the orchestrator runs one such 1 ms wait per stage per round), and a
        # ``TaskGroup`` cancels its children only once: cancelling ``main`` again would
        # never reach a child that swallowed the first (a benchmark run hung in stop).
        while self._thread.is_alive():
            if self.loop is not None:
                with contextlib.suppress(RuntimeError):  # already closed
                    self.loop.call_soon_threadsafe(_cancel_every_task)
            self._thread.join(STOP_RETRY_S)

    def _run(self) -> None:
        async def wrapper() -> None:
            self.loop = asyncio.get_running_loop()
            self._ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._main()

        asyncio.run(wrapper())


def _cancel_every_task() -> None:
    for task in asyncio.all_tasks():
        task.cancel()
