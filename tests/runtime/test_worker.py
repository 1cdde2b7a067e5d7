"""The stage's worker thread: jobs in order, and a queued job replaced before it starts."""

from __future__ import annotations

import threading

import outcome
import trio

from omnitrio._worker import WorkerThread


async def test_a_queued_job_is_replaced_until_the_worker_starts_it() -> None:
    worker = WorkerThread("test-worker")
    release, running = threading.Event(), threading.Event()
    results: list[str] = []
    done = trio.Event()

    def hold() -> str:
        running.set()
        release.wait()
        return "held"

    def record(value: outcome.Outcome[str]) -> None:
        results.append(value.unwrap())
        if len(results) == 3:
            done.set()

    first = worker.submit(hold, record)
    await trio.to_thread.run_sync(running.wait)  # job 0 runs, job 1 will queue behind it
    queued = worker.submit(lambda: "planned", record)
    assert not worker.replace(first, lambda: lambda: "too late")  # running, and not the newest
    assert worker.replace(queued, lambda: lambda: "amended")  # queued: its callable is swapped
    running.clear()
    release.clear()
    release_later = worker.submit(hold, record)
    release.set()
    await trio.to_thread.run_sync(running.wait)  # job 2 has started
    assert not worker.replace(release_later, lambda: lambda: "too late")
    release.set()
    with trio.fail_after(10):
        await done.wait()
    assert results == ["held", "amended", "held"]
    assert await worker.stop(trio.current_time() + 10)
