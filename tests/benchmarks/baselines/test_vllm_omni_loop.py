"""The vllm-omni model's asyncio loop on a thread: stopping it always ends its thread."""

from __future__ import annotations

import asyncio
import threading

from benchmarks.baselines._vllm_omni_loop import ThreadLoop

HANG_GUARD_S = 30.0  # only bounds a failing run; a passing stop takes a few retries


def test_stop_reaches_a_task_group_child_that_swallowed_the_first_cancellation() -> None:
    # As Python 3.11's ``asyncio.wait_for`` does when a cancellation races its inner
    # wait's completion: the child survives the first cancel, and a TaskGroup never
    # cancels its children a second time, however often its parent is cancelled.
    swallowed = threading.Event()

    async def child() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()
        await asyncio.Event().wait()  # only a second cancellation ends this

    async def main() -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(child())

    loop = ThreadLoop("test-loop", main)
    loop.start()
    stopper = threading.Thread(target=loop.stop, daemon=True)
    stopper.start()
    stopper.join(HANG_GUARD_S)
    assert swallowed.is_set()
    assert not stopper.is_alive(), "stop() never ended the loop's thread"
