"""Off-critical-path packaging for autoregressive stages (seed 002).

An AR stage's next step needs only the sampled tokens. Everything else a step
produces — detokenized text, embeddings and hidden-state slices for the next
stage, the output objects themselves — is built here, on a per-stage packaging
thread fed by a bounded queue, while the stage's worker thread goes on to the
next forward. A full queue makes ``submit`` wait: packaging that cannot keep up
slows the stage down instead of growing memory.

Results are kept per stream and handed out by ``take`` within a step's limits.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass
class Packed:
    """What packaging made for one stream (in order), and whether it was the last."""

    payloads: list[object] = field(default_factory=list)
    visible: list[object] = field(default_factory=list)
    last: bool = False


@dataclass(frozen=True)
class _Job:
    stream_ids: tuple[str, ...]
    build: Callable[[], Mapping[str, Packed]]


class PackagingError(RuntimeError):
    """A packaging job raised; the streams it covered fail with this error."""


class Packager:
    """A thread that runs packaging jobs in order and keeps their results per stream."""

    def __init__(self, name: str, *, capacity: int = 4) -> None:
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=capacity)
        self._open: set[str] = set()
        self._ready: dict[str, deque[Packed]] = {}
        self._failed: dict[str, Exception] = {}
        self._done = threading.Condition()
        self._num_pending = 0
        self.num_jobs = 0
        self.packaging_s = 0.0
        # Started by the first job, so a stage that fails to load leaves no thread.
        self._thread = threading.Thread(target=self._run, name=f"omnitrio-pack-{name}", daemon=True)

    def open(self, stream_id: str) -> None:
        with self._done:
            self._open.add(stream_id)

    def submit(
        self, stream_ids: tuple[str, ...], build: Callable[[], Mapping[str, Packed]]
    ) -> None:
        """Queue a job making results for ``stream_ids``; waits while the queue is full."""
        with self._done:
            self._num_pending += 1
            if not self._thread.is_alive() and self._thread.ident is None:
                self._thread.start()
        self._jobs.put(_Job(stream_ids, build))

    def take(self, stream_id: str, max_payloads: int, max_visible: int) -> tuple[Packed, bool]:
        """Ready results for ``stream_id`` within the limits, and whether the last one is out."""
        out = Packed()
        with self._done:
            if stream_id in self._failed:
                raise PackagingError(str(self._failed.pop(stream_id))) from None
            ready = self._ready.get(stream_id)
            while ready:
                head = ready[0]
                if (
                    len(out.payloads) + len(head.payloads) > max_payloads
                    or len(out.visible) + len(head.visible) > max_visible
                ):
                    if out.payloads or out.visible:
                        break
                    # One result larger than a step may emit: hand it out in parts.
                    part = Packed(head.payloads[:max_payloads], head.visible[:max_visible])
                    del head.payloads[:max_payloads], head.visible[:max_visible]
                    return part, False
                ready.popleft()
                out.payloads += head.payloads
                out.visible += head.visible
                if head.last:
                    out.last = True
                    del self._ready[stream_id]
                    break
        return out, out.last

    def wait(self, timeout_s: float) -> None:
        """Wait until every submitted job has run, or ``timeout_s`` passed."""
        with self._done:
            self._done.wait_for(lambda: self._num_pending == 0, timeout=timeout_s)

    def forget(self, stream_id: str) -> None:
        """Drop what is kept for a closing stream; later results for it are dropped."""
        with self._done:
            self._open.discard(stream_id)
            self._ready.pop(stream_id, None)
            self._failed.pop(stream_id, None)

    def close(self) -> None:
        if self._thread.ident is not None:
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            started = time.perf_counter()
            try:
                results, error = job.build(), None
            except Exception as exc:  # a job's failure fails its streams, not the stage
                results, error = {}, exc
            elapsed = time.perf_counter() - started
            with self._done:
                self.num_jobs += 1
                self.packaging_s += elapsed
                self._num_pending -= 1
                if error is not None:
                    for stream_id in job.stream_ids:
                        if stream_id in self._open:
                            self._failed[stream_id] = error
                for stream_id, packed in results.items():
                    if stream_id in self._open:
                        self._ready.setdefault(stream_id, deque()).append(packed)
                self._done.notify_all()
