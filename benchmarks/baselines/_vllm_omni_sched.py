"""The chunk bookkeeping a vllm-omni stage scheduler does on every ``schedule()``.

With ``async_chunk``, vllm-omni binds every admitted request to every stage at once
(``Orchestrator._prewarm_async_chunk_stages``), so a talker or code2wav replica
holds *all* the requests in flight that are bound to it, most of them waiting
for their next chunk. Its scheduler (``OmniARScheduler.schedule``,
``OmniGenerationScheduler.schedule``) wraps vLLM's ``schedule()`` in:

- ``process_pending_chunks(waiting, running)`` (``OmniChunkTransferAdapter``, later
  ``OmniSchedulingCoordinator``): a snapshot of the waiting queue and of the
  running list, every request visited (its status, the ready / finished sets),
  each one without a chunk marked ``WAITING_FOR_CHUNK``, removed from its queue
  (``queue.remove``) and parked; then running requests beyond ``max_num_seqs``
  are put back at the head of the waiting queue;
- vLLM's admission of ready waiting requests up to ``max_num_seqs``;
- ``restore_queues``: every parked request added back to its queue;
- ``postprocess_scheduler_output`` / ``_clear_chunk_ready``: the scheduled ids
  taken off the ready set.

This is the model's one per-step cost that grows with the number of requests in
flight, waiting ones included (the engine calls it on every loop iteration,
including the 1 ms back-offs while every request waits for a chunk). It does the
same data-structure work on the same containers (a deque and a list of request
objects, sets and a dict), so its cost is Python's, not a constant; ``visits``
counts the requests it looked at. The batch the model steps is still chosen by
the engine's ``pick`` (the first ``max_batch_size`` bound requests with input),
which is what this admission amounts to.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

WAITING, RUNNING, WAITING_FOR_CHUNK = "waiting", "running", "waiting_for_chunk"


class _Request:
    """The fields of vLLM's ``Request`` that the chunk bookkeeping reads and writes."""

    __slots__ = ("request_id", "status")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.status = WAITING


class ChunkQueues:
    """One stage replica's waiting queue and running list, with the chunk bookkeeping."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self._requests: dict[str, _Request] = {}
        self._parked_waiting: deque[_Request] = deque()
        self._parked_running: deque[_Request] = deque()
        self._ready: set[str] = set()  # requests_with_ready_chunks
        self._finished: set[str] = set()  # their last chunk has arrived
        self._waiting_since: dict[str, float] = {}
        self.visits = 0  # requests visited by process_pending_chunks, all scans
        self.scans = 0

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request_id: str) -> None:
        request = _Request(request_id)
        self._requests[request_id] = request
        self.waiting.append(request)

    def finish(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        for queue in (self.running, self.waiting):
            if request in queue:
                queue.remove(request)
        self._ready.discard(request_id)
        self._finished.discard(request_id)
        self._waiting_since.pop(request_id, None)

    def schedule(self, ready: set[str], finished: set[str], scheduled: Iterable[str]) -> None:
        """One ``schedule()``'s bookkeeping: ``ready`` have a chunk (or need no
        input), ``finished`` have had their last one, ``scheduled`` are stepped."""
        self._process_pending_chunks(ready, finished)
        while self.waiting and len(self.running) < self.max_num_seqs:  # vLLM's admission
            request = self.waiting.popleft()
            request.status = RUNNING
            self.running.append(request)
        self._restore_queues()
        for request_id in scheduled:  # _clear_chunk_ready
            self._ready.discard(request_id)

    def _process_pending_chunks(self, ready: set[str], finished: set[str]) -> None:
        self.scans += 1
        self._finished.update(finished)
        self._scan(self.waiting, self._parked_waiting, WAITING, ready)
        self._scan(self.running, self._parked_running, RUNNING, ready)
        while len(self.running) > self.max_num_seqs:
            request = self.running.pop()
            request.status = WAITING
            self.waiting.appendleft(request)

    def _scan(
        self,
        queue: deque[_Request] | list[_Request],
        parked: deque[_Request],
        target_status: str,
        ready: set[str],
    ) -> None:
        for request in list(queue):
            self.visits += 1
            request_id = request.request_id
            if request.status != WAITING_FOR_CHUNK:
                if request_id in self._ready or request_id in self._finished:
                    continue
                if request_id in ready:
                    self._ready.add(request_id)
                    continue
                request.status = WAITING_FOR_CHUNK
                self._waiting_since.setdefault(request_id, time.monotonic())
            elif request_id in ready:
                request.status = target_status
                self._ready.add(request_id)
                self._waiting_since.pop(request_id, None)
                continue
            queue.remove(request)
            parked.append(request)

    def _restore_queues(self) -> None:
        self.waiting.extend(self._parked_waiting)
        self._parked_waiting = deque()
        self.running.extend(self._parked_running)
        self._parked_running = deque()
