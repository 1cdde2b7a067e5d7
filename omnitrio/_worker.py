"""A dedicated OS thread per stage.

trio's ``to_thread`` shares one limiter (40 threads) across the whole run and
hands each call to whatever cached thread is free. A model stage wants the
opposite: one long-lived thread that owns the model (CUDA context, torch
thread-local state) and runs its calls in order. ``WorkerThread`` is that: a
job queue into the thread and one ``run_sync_soon`` back into trio per job.
``submit`` is the seam the actor executes through: plan and apply stay on trio,
the job runs here (a remote call could take its place).

The hand-over: the trio thread lets a worker start a job before it goes on. Posting
a result, or queuing a job for an idle worker, wakes the other thread, and the two
race for the GIL; if trio wins, the worker (a GPU stage between two kernels) sits
idle until trio's apply, plan and client deliveries are through and it blocks again
(0.4-1.2 ms at 64 streams). So when a job ends with the next one queued, trio waits,
GIL released, until the worker has taken it before it runs ``on_done``; and when it
queues a job for an idle worker, until the worker has taken that one (each wait at
most ``HANDOVER_TIMEOUT_S``). The worker then goes on into its step.

A job queued and not yet started can be replaced (``replace``): the actor puts a
newcomer's first step into the round queued behind the running one, instead of the
round after it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

logger = logging.getLogger(__name__)

HANDOVER_TIMEOUT_S = 0.5e-3
"""The longest the trio thread waits, GIL released, for the worker to take its next job."""

T = TypeVar("T")
_Job = Callable[[], None]


class WorkerThread:
    """Runs callables on one dedicated thread, one at a time, in submission order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._token = trio.lowlevel.current_trio_token()
        self._num_submitted = 0  # trio thread only
        self._num_started = 0  # written by the worker under _started
        self._num_done = 0  # written by the worker
        self._last: tuple[int, list[Callable[[], Any]]] | None = None  # the newest job's callable
        self._started = threading.Condition(threading.Lock())
        self._exited = trio.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T], on_done: Callable[[outcome.Outcome[T]], None]) -> int:
        """Queue ``fn()`` on the worker thread; ``on_done(outcome)`` then runs on the trio
        thread (one crossing in, one ``run_sync_soon`` back). Never waits for the job to
        finish (the actor keeps a second job queued behind the running one this way);
        if the worker was idle, waits at most ``HANDOVER_TIMEOUT_S`` for it to take the
        job (the hand-over, above). Returns the job's number (for ``replace``)."""

        number = self._num_submitted
        idle = self._num_done == number  # the worker waits for a job: it wakes for this one
        self._num_submitted += 1
        call: list[Callable[[], T]] = [fn]  # read when the job starts: ``replace`` swaps it
        self._last = (number, call)

        def job() -> None:
            value = outcome.capture(call[0])
            try:
                self._token.run_sync_soon(self._hand_over, number, on_done, value)
            except trio.RunFinishedError:
                # The trio run is gone (the thread outlived its pipeline): nobody waits.
                logger.warning("worker %s finished a job after its trio run ended", self.name)

        self._jobs.put(job)
        if idle:
            self._wait_started(number)
        return number

    def replace(self, number: int, make: Callable[[], Callable[[], Any]]) -> bool:
        """If job ``number`` is the newest and the worker has not started it, run it as
        ``make()``'s callable instead (its ``on_done`` stays). ``make`` runs here, on the
        calling thread, under the lock the worker takes to start a job, so the job cannot
        start meanwhile. False, and ``make`` not called, if it has started."""
        last = self._last
        if last is None or last[0] != number:
            return False
        with self._started:
            if self._num_started > number:
                return False
            last[1][0] = make()
        return True

    def _wait_started(self, number: int) -> None:
        """Wait, GIL released, until the worker has taken job ``number`` (at most
        ``HANDOVER_TIMEOUT_S``)."""
        if self._num_started <= number:
            with self._started:
                self._started.wait_for(lambda: self._num_started > number, HANDOVER_TIMEOUT_S)

    def _hand_over(
        self, number: int, on_done: Callable[[outcome.Outcome[T]], None], value: outcome.Outcome[T]
    ) -> None:
        """On the trio thread: let the worker start job ``number + 1`` if it is queued,
        then ``on_done(value)``."""
        if self._num_submitted > number + 1:
            self._wait_started(number + 1)
        on_done(value)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the worker thread and return its result (or raise its error).

        Cancellation: the wait is cancellable, but ``fn`` still runs to completion on
        the thread (a thread cannot be interrupted); its result is then dropped. Later
        jobs run after it.
        """
        done = trio.Event()
        result: list[outcome.Outcome[T]] = []

        def finish(value: outcome.Outcome[T]) -> None:
            result.append(value)
            done.set()

        self.submit(fn, finish)
        await done.wait()
        return result[0].unwrap()

    async def stop(self, deadline: float) -> bool:
        """Let queued jobs finish, then end the thread. Returns False if it did not end in time.

        Runs shielded from cancellation (it is teardown), until trio time ``deadline``.
        """
        self._jobs.put(None)
        with trio.CancelScope(shield=True, deadline=deadline):
            await self._exited.wait()
        if self._exited.is_set():
            self._thread.join()
            return True
        return False

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._started:
                self._num_started += 1
                self._started.notify()
            job()
            self._num_done += 1
        try:
            self._token.run_sync_soon(self._exited.set)
        except trio.RunFinishedError:
            logger.warning("worker %s ended after its trio run ended", self.name)
