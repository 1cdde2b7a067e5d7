"""The orchestrator's loop *shape*, in one process and with none of its costs: a baseline.

What it teaches: the shape of vllm-omni's orchestrator (one polling thread, at
most one raw output per stage per round, 1 ms waits) costs next to nothing on
its own when stage steps take milliseconds and outputs cost microseconds; what
hurts is what ``_vllm_omni_model.py`` adds on the same path (a process per stage,
serialization, hidden states at their real sizes, the connector threads, the
packaging on the decode path). Same stage objects as omnitrio:

- **Stage workers** (threads here): each steps up to ``max_batch_size`` of its
  running requests and puts the step's raw output — visible items *and*
  inter-stage payloads — on its unbounded ``outputs`` queue (seed 000's route,
  without its costs).
- **Async-chunk transfer** (seed 004): payloads go straight to the next stage's
  per-request inbox, an unbounded deque. A downstream request with no chunk
  waiting is skipped; when no running request has input the worker backs off
  1 ms, as the transfer adapter's ``recv_loop`` does. Every stage is
  pre-submitted when the request arrives (the prewarm).
- **The orchestrator** (one thread): polls the stages in order and takes **at
  most one raw output per stage per round**, waiting up to **1 ms on an empty
  stage**; after an idle round it sleeps 1 ms (seed 001). Payload "copies" are
  ``bytes(b)`` of the stage's own bytes (no copy at all) and the finish-time
  join concatenates them; visible items go to the client through an unbounded
  queue.
- **No admission limit**: requests beyond ``max_batch_size`` wait in the
  stage's running list (vLLM's waiting queue), never refused.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from omnitrio import PipelineConfig, Request, Stage, StreamOutput, StreamWork

from ..harness._clients import Delivery, deliver, follow
from ..harness._stages import load_stages
from ..harness._target import Prompt, Sample, Timeline, rss_bytes_of_self

POLL_TIMEOUT_S = 0.001  # the orchestrator's wait on each empty stage
IDLE_SLEEP_S = 0.001  # after a round with no output; also the recv_loop back-off


@dataclass(frozen=True)
class _RawOutput:
    """One step of one stage, as it reaches the orchestrator."""

    outputs: dict[str, StreamOutput]


@dataclass
class _Client:
    send: trio.MemorySendChannel[Delivery]
    accumulated: dict[int, list[bytes]] = field(default_factory=dict)
    stages_done: set[int] = field(default_factory=set)


class _StageWorker:
    """One stage's engine loop on its own thread."""

    def __init__(self, index: int, name: str, stage: Stage, max_batch_size: int) -> None:
        self.index = index
        self.name = name
        self.stage = stage
        self.max_batch_size = max_batch_size
        self.outputs: queue.Queue[_RawOutput] = queue.Queue()  # unbounded, to the orchestrator
        self.downstream: _StageWorker | None = None
        self._lock = threading.Lock()
        self._new: deque[tuple[str, Request]] = deque()
        self._aborted: deque[str] = deque()
        self._inbox: dict[str, deque[object]] = {}  # async-chunk transfer, unbounded
        self._upstream_done: set[str] = set()
        self._running: list[str] = []
        self.last_batch_size = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"shape-stage-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def submit(self, stream_id: str, request: Request) -> None:
        with self._lock:
            self._new.append((stream_id, request))
            self._inbox[stream_id] = deque()
        self._wake.set()

    def abort(self, stream_id: str) -> None:
        with self._lock:
            self._aborted.append(stream_id)
        self._wake.set()

    def put_chunk(self, stream_id: str, payloads: Sequence[object], done: bool) -> None:
        with self._lock:
            inbox = self._inbox.get(stream_id)
            if inbox is not None:
                inbox.extend(payloads)
                if done:
                    self._upstream_done.add(stream_id)

    @property
    def backlog(self) -> int:
        with self._lock:
            return sum(len(d) for d in self._inbox.values())

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit_and_abort()
            batch = self._pick()
            if not batch and not self._running:  # idle engine: block on new requests
                self._wake.wait()
                self._wake.clear()
                continue
            if not batch:  # requests waiting for chunks: the recv_loop's back-off
                time.sleep(IDLE_SLEEP_S)
                continue
            self.last_batch_size = len(batch)
            try:
                results = dict(self.stage.step(batch))
            except Exception as exc:  # the whole batch fails, as in omnitrio
                results = {w.stream_id: StreamOutput(error=exc) for w in batch}
            for stream_id, out in results.items():
                if out.payloads and self.downstream is not None:
                    self.downstream.put_chunk(stream_id, out.payloads, out.done)
                elif out.done and self.downstream is not None:
                    self.downstream.put_chunk(stream_id, (), True)
                if out.done or out.error is not None:
                    self._finish(stream_id)
            self.outputs.put(_RawOutput(results))

    def _admit_and_abort(self) -> None:
        with self._lock:
            new, self._new = list(self._new), deque()
            aborted, self._aborted = list(self._aborted), deque()
        for stream_id, request in new:
            try:
                self.stage.open_stream(stream_id, request)
            except Exception as exc:  # that request fails; the engine serves on
                self.outputs.put(_RawOutput({stream_id: StreamOutput(error=exc)}))
                continue
            self._running.append(stream_id)
        for stream_id in aborted:
            if stream_id in self._running:
                self._finish(stream_id)

    def _pick(self) -> list[StreamWork]:
        batch: list[StreamWork] = []
        with self._lock:
            for stream_id in self._running:
                if len(batch) == self.max_batch_size:
                    break
                if self.index == 0:
                    batch.append(StreamWork(stream_id, (), True))
                    continue
                inbox = self._inbox[stream_id]
                closed = stream_id in self._upstream_done
                if not inbox and not closed:
                    continue  # WAITING_FOR_CHUNK
                limit = self.stage.max_inputs_per_step or len(inbox)
                taken = tuple(inbox.popleft() for _ in range(min(limit, len(inbox))))
                batch.append(StreamWork(stream_id, taken, closed and not inbox))
        return batch

    def _finish(self, stream_id: str) -> None:
        self._running.remove(stream_id)
        self.stage.close_stream(stream_id)
        with self._lock:
            self._inbox.pop(stream_id, None)
            self._upstream_done.discard(stream_id)


class OrchestratorShape:
    """Stage workers plus the polling orchestrator thread; see the module docstring."""

    name = "orchestrator-shape"

    def __init__(self, workers: list[_StageWorker], token: trio.lowlevel.TrioToken) -> None:
        self._workers = workers
        self._token = token
        self._clients: dict[str, _Client] = {}
        self._clients_lock = threading.Lock()
        self._ids = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="orchestrator-shape", daemon=True)

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for worker in self._workers:
            worker.stop()

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        self._ids += 1
        stream_id = f"seed{self._ids}"
        send, receive = trio.open_memory_channel[Delivery](math.inf)
        with self._clients_lock:
            self._clients[stream_id] = _Client(send)
        request = prompt.request()
        for worker in self._workers:  # stage 0 plus the prewarmed downstream stages
            worker.submit(stream_id, request)
        await follow(receive, timeline, lambda completed: self._forget(stream_id, completed))

    def _forget(self, stream_id: str, completed: bool) -> None:
        with self._clients_lock:
            del self._clients[stream_id]
        if not completed:  # failed or abandoned: abort it in every stage
            for worker in self._workers:
                worker.abort(stream_id)

    async def sample(self) -> Sample:
        depth = {f"{w.name}.outputs": w.outputs.qsize() for w in self._workers}
        depth |= {f"{w.name}.inbox": w.backlog for w in self._workers[1:]}
        return Sample(
            at_s=0.0,
            open_streams=len(self._clients),
            queue_depth=depth,
            batch_size={w.name: float(w.last_batch_size) for w in self._workers},
            rss_bytes=rss_bytes_of_self(),
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = True
            for worker in self._workers:  # at most one output per stage per round
                try:
                    raw = worker.outputs.get(timeout=POLL_TIMEOUT_S)
                except queue.Empty:
                    continue
                idle = False
                self._process(worker.index, raw)
            if idle:
                time.sleep(IDLE_SLEEP_S)

    def _process(self, stage_index: int, raw: _RawOutput) -> None:
        for stream_id, out in raw.outputs.items():
            with self._clients_lock:
                client = self._clients.get(stream_id)
            if client is None:
                continue
            acc = client.accumulated.setdefault(stage_index, [])
            acc += (_cpu_copy(p) for p in out.payloads)  # hidden states through the orchestrator
            for item in out.visible:
                self._deliver(client, item)
            if out.error is not None:
                self._deliver(client, out.error)
            elif out.done:
                b"".join(client.accumulated.pop(stage_index, []))  # finish-time consolidation
                client.stages_done.add(stage_index)
                if len(client.stages_done) == len(self._workers):  # every output stage finished
                    self._deliver(client, None)

    def _deliver(self, client: _Client, item: Delivery) -> None:
        deliver(self._token, client.send, item)


def _cpu_copy(payload: object) -> bytes:
    data = getattr(payload, "data", None)
    return bytes(data) if isinstance(data, bytes | bytearray) else b""


@asynccontextmanager
async def open_orchestrator_shape(config: PipelineConfig) -> AsyncIterator[OrchestratorShape]:
    """Load the config's stages and run them under the orchestrator's loop shape."""
    stages = await trio.to_thread.run_sync(load_stages, config)
    workers = [
        _StageWorker(i, spec.name, stage, spec.max_batch_size)
        for i, (stage, spec) in enumerate(zip(stages, config.stages, strict=True))
    ]
    for upstream, downstream in itertools.pairwise(workers):
        upstream.downstream = downstream
    orchestrator = OrchestratorShape(workers, trio.lowlevel.current_trio_token())
    orchestrator.start()
    try:
        yield orchestrator
    finally:
        await trio.to_thread.run_sync(orchestrator.stop)
        for stage in stages:
            stage.close()
