"""A model of vllm-omni's serving path, as a benchmark baseline, on omnitrio's stage objects.

Not vllm-omni itself: the same stage objects and batching policy as omnitrio,
served the way vllm-omni serves Qwen3-Omni with ``async_chunk`` (seeds 000-004
and vllm-omni's source; ``docs/benchmarks.md`` cites the file and function each
mechanism stands for and the cost it charges):

- **A process per stage** (``StageEngineCoreProc``): an engine loop stepping up to
  ``max_batch_size`` running requests (the rest wait, none refused), an output
  thread that serializes every step's outputs with msgpack and sends them over
  ZMQ, arrays as separate frames (vLLM's ``MsgpackEncoder``).
- **Hidden states at Qwen3-Omni's sizes**: each thinker token brings two
  ``[1, 2048]`` bf16 rows (layer 0, the embedding, and layer 24, the accept
  layer: what the talker reads), each talker token a ``[1, 16]`` codec row.
  They are copied off the "device" in the engine loop (``sample_tokens``'s
  D2H copy), sent to the next stage through the connector *and* to the
  orchestrator in the step's output (seed 000; not to the orchestrator with
  ``hidden_states_to_orchestrator`` off: PR 4527).
- **The connector** (``OmniTransferAdapterBase``): ``save_async`` queues a task
  (an unbounded deque, or a ``Semaphore(512)`` taken by the engine loop, PR
  3690); a save thread pickles the chunk into a POSIX shared-memory segment per
  key; a receive thread polls every waiting request's next key, backing off
  1 ms after a pass with no progress; it loads one chunk of a request, then
  waits for the engine to take it (``_poll_single_request``, ``rearm``). The
  talker's chunks hold ``inputs_per_step`` codec frames of the next stage
  (``codec_chunk_frames``).
- **The scheduler's chunk bookkeeping** (``_vllm_omni_sched``): every engine-loop
  iteration of a stage after the first visits every request bound to it,
  waiting ones included (``process_pending_chunks`` / ``restore_queues``).
- **Talker payload packaging** held on the decode critical path with the GIL
  (seed 002: ``sample_tokens`` 6.38 ms against ``_sample`` 0.99 ms), a
  parameter; with ``async_output`` (PR 4476) a background thread of the stage
  process does it and sends the step's outputs, the engine loop goes on.
- **The head process** (``_vllm_omni_head``): the orchestrator's asyncio loop
  on its own thread (admission and aborts through its request queue, the
  polling or event-driven output loop, the output processor's per-request work
  of ``_vllm_omni_outputs``) and the API server's loop writing each chunk.
- **Variants** (``_vllm_omni_settings``): the seeds' vllm-omni, with PR 3690's
  semaphore, and today's (PRs 4527, 4476 and 5221) on this one code path.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
import os
import pickle
import queue
import tempfile
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]
import numpy
import trio
import zmq

from omnitrio import AudioChunk, PipelineConfig, Request, Stage, StreamOutput, StreamWork, TextDelta

from ..harness._stages import load_stage
from ..harness._target import TargetError
from ._vllm_omni_sched import ChunkQueues
from ._vllm_omni_settings import ModelSettings

if TYPE_CHECKING:  # the head imports torch; the stage processes do not need it
    from ._vllm_omni_head import VllmOmniModel

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.001  # the orchestrator's wait on each empty stage
IDLE_SLEEP_S = 0.001  # after an idle round; also the engine's back-off with no chunk ready
RECV_BACKOFF_S = 0.001  # the receive thread after a pass with no progress
CONNECTOR_IDLE_S = 0.1  # the save and receive threads with nothing to do
HIDDEN_SIZE = 2048  # Qwen3-Omni thinker hidden size
HIDDEN_LAYERS = ("0", "24")  # embedding and accept_hidden_layer, what the talker reads
CODEC_GROUPS = 16  # codec rows [1, 16] per talker token
# The dtype each "device" array has on the wire (torch's names, as vLLM's encoder
# writes them): the hidden rows are bf16 (numpy has no bf16: uint16 carries its bytes).
WIRE_DTYPES = {"uint16": "bfloat16", "int64": "int64"}
READY_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- stage process


class _Connector:
    """Save and receive threads moving chunks through shared memory (one per stage)."""

    def __init__(self, run_id: str, index: int, settings: ModelSettings, sends: bool) -> None:
        self._run_id = run_id
        self._index = index
        self._stop = threading.Event()
        self._save: deque[tuple[str, dict[str, Any]]] = deque()
        self._save_cond = threading.Condition()
        self._limit = (
            threading.Semaphore(settings.save_limit) if settings.save_limit is not None else None
        )
        self._loads: deque[str] = deque()  # streams waiting for their next chunk
        self._one_per_load = settings.chunk_per_schedule
        self._armed: set[str] = set()  # registered for their next chunk (under lock)
        self._load_cond = threading.Condition()
        self._next_chunk: dict[str, int] = {}
        self.lock = threading.Lock()  # guards inbox and upstream_done
        self.inbox: dict[str, deque[object]] = {}
        self.upstream_done: set[str] = set()
        self._unconsumed: OrderedDict[str, None] = OrderedDict()  # keys put, maybe not taken
        self._threads = [threading.Thread(target=self._recv_loop, daemon=True)]
        if sends:
            self._threads.append(threading.Thread(target=self._save_loop, daemon=True))
        for thread in self._threads:
            thread.start()

    def key(self, stream_id: str, chunk: int, from_index: int) -> str:
        return f"vo{self._run_id}_{stream_id}_{from_index}_{chunk}"

    def stop(self) -> None:
        self._stop.set()
        for cond in (self._save_cond, self._load_cond):
            with cond:
                cond.notify_all()
        for thread in self._threads:
            thread.join()
        for name in self._unconsumed:  # chunks nobody took (aborted streams)
            _unlink(name)

    # Sending side: ``save_async`` on the engine loop, ``_save_loop`` on its thread.

    def save_async(self, key: str, chunk: dict[str, Any]) -> None:
        if self._limit is not None:
            self._limit.acquire()  # PR 3690: blocks the engine loop when 512 are in flight
        self._save.append((key, chunk))
        with self._save_cond:
            self._save_cond.notify()

    def _save_loop(self) -> None:
        while not self._stop.is_set():
            while self._save:
                key, chunk = self._save.popleft()
                try:
                    self._put(key, chunk)
                except OSError as exc:  # as vllm-omni's save_loop: warn, serve on
                    logger.warning("saving chunk %s failed: %s", key, exc)
                finally:
                    if self._limit is not None:
                        self._limit.release()
            with self._save_cond:
                if not self._save and not self._stop.is_set():
                    self._save_cond.wait(CONNECTOR_IDLE_S)

    def _put(self, key: str, chunk: dict[str, Any]) -> None:
        # reap_consumed: a bounded sweep of the keys the receiver has unlinked
        for _ in range(min(64, len(self._unconsumed))):
            old, _ = self._unconsumed.popitem(last=False)
            if os.path.exists(_shm_path(old)):
                self._unconsumed[old] = None
        data = pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
        fd = os.open(_shm_path(key), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, 8 + len(data))
            with mmap.mmap(fd, 8 + len(data)) as segment:
                segment[8:] = data
                segment[:8] = len(data).to_bytes(8, "little")  # written last: "ready"
        finally:
            os.close(fd)
        self._unconsumed[key] = None

    # Receiving side: ``load_async`` on the engine loop, ``_recv_loop`` on its thread.

    def load_async(self, stream_id: str) -> None:
        with self.lock:
            self.inbox[stream_id] = deque()
            self._next_chunk[stream_id] = 0
            self._armed.add(stream_id)
        self._loads.append(stream_id)
        with self._load_cond:
            self._load_cond.notify()

    def rearm(self, stream_id: str) -> None:
        """``load_async`` again for a request its scheduler found without a chunk
        (``pending_chunk_registrations``): with one chunk per registration, the
        receive thread polls a request's next key only after this."""
        if not self._one_per_load:
            return
        with self.lock:
            if (
                stream_id in self._armed
                or stream_id not in self._next_chunk
                or stream_id in self.upstream_done
            ):
                return
            self._armed.add(stream_id)
        self._loads.append(stream_id)
        with self._load_cond:
            self._load_cond.notify()

    def drop(self, stream_id: str) -> None:
        with self.lock:
            self.inbox.pop(stream_id, None)
            self._next_chunk.pop(stream_id, None)
            self.upstream_done.discard(stream_id)
            self._armed.discard(stream_id)

    def _recv_loop(self) -> None:
        while not self._stop.is_set():
            progress = False
            for _ in range(len(self._loads)):
                stream_id = self._loads.popleft()
                with self.lock:
                    chunk_index = self._next_chunk.get(stream_id)
                if chunk_index is None:
                    continue  # finished or aborted
                chunk = _get(self.key(stream_id, chunk_index, self._index - 1))
                if chunk is None:
                    self._loads.append(stream_id)
                    continue
                progress = True
                with self.lock:
                    if stream_id in self.inbox:
                        self.inbox[stream_id].extend(chunk["payloads"])
                        self._next_chunk[stream_id] = chunk_index + 1
                        if chunk["done"]:
                            self.upstream_done.add(stream_id)
                    if self._one_per_load:  # _poll_single_request: one chunk, then off
                        self._armed.discard(stream_id)
                if not chunk["done"] and not self._one_per_load:
                    self._loads.append(stream_id)
            with self._load_cond:
                if not self._loads and not self._stop.is_set():
                    self._load_cond.wait(CONNECTOR_IDLE_S)
                elif not progress and not self._stop.is_set():
                    self._load_cond.wait(RECV_BACKOFF_S)


def _shm_path(key: str) -> str:
    # A POSIX shared-memory segment is this file on Linux: shm_open(key) opens it,
    # as multiprocessing.shared_memory does (without its resource tracker).
    return f"/dev/shm/{key}"


def _get(key: str) -> dict[str, Any] | None:
    """Take the chunk at ``key`` if it is there and written; the reader unlinks it."""
    try:
        fd = os.open(_shm_path(key), os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            return None  # created, not sized yet
        with mmap.mmap(fd, size) as segment:
            length = int.from_bytes(segment[:8], "little")
            if length == 0:
                return None  # not written yet
            chunk: dict[str, Any] = pickle.loads(segment[8 : 8 + length])
    finally:
        os.close(fd)
    os.unlink(_shm_path(key))
    return chunk


def _unlink(key: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_shm_path(key))


@dataclass
class _Engine:
    """One stage's engine loop, in the stage's own process."""

    index: int
    num_stages: int
    stage: Stage
    max_batch_size: int
    frames_per_chunk: int  # the next stage's inputs per step: one chunk per that many units
    settings: ModelSettings
    connector: _Connector
    outputs: queue.Queue[list[Any] | None]
    running: list[str] = field(default_factory=list)
    pending: dict[str, list[object]] = field(default_factory=dict)  # payloads not yet chunked
    chunks: dict[str, int] = field(default_factory=dict)
    device: dict[str, numpy.ndarray[Any, Any]] = field(default_factory=dict)
    more: set[str] = field(default_factory=set)  # asked for a step without new input
    packer: queue.Queue[tuple[float, list[Any]] | None] | None = None  # async output's
    sched: ChunkQueues | None = None  # the scheduler's chunk bookkeeping (stages after 0)

    def __post_init__(self) -> None:
        if self.index > 0 and self.settings.chunk_scan:
            self.sched = ChunkQueues(self.max_batch_size)
        # What one unit leaves on the "device": the hidden rows the talker reads
        # (thinker), a codec row (talker), nothing from the last stage.
        if self.index == 0:
            self.device = {k: numpy.ones((1, HIDDEN_SIZE), numpy.uint16) for k in HIDDEN_LAYERS}
        elif self.index < self.num_stages - 1:
            self.device = {"codes": numpy.ones((1, CODEC_GROUPS), numpy.int64)}

    def add(self, stream_id: str, request: Request) -> None:
        try:
            self.stage.open_stream(stream_id, request)
        except Exception as exc:  # that request fails; the engine serves on
            self.outputs.put([_output(stream_id, StreamOutput(error=exc), [])])
            return
        self.running.append(stream_id)
        self.pending[stream_id] = []
        self.chunks[stream_id] = 0
        if self.sched is not None:
            self.sched.add(stream_id)
        if self.index > 0:
            self.connector.load_async(stream_id)

    def abort(self, stream_id: str) -> None:
        if stream_id in self.running:
            self._finish(stream_id)

    def pick(self) -> list[StreamWork]:
        batch: list[StreamWork] = []
        for stream_id in self.running:
            if len(batch) == self.max_batch_size:
                break
            if self.index == 0:
                batch.append(StreamWork(stream_id, (), True))
                continue
            with self.connector.lock:
                inbox = self.connector.inbox[stream_id]
                closed = stream_id in self.connector.upstream_done
                if not inbox and not closed and stream_id not in self.more:
                    continue  # WAITING_FOR_CHUNK
                limit = self.stage.max_inputs_per_step or len(inbox)
                taken = tuple(inbox.popleft() for _ in range(min(limit, len(inbox))))
                batch.append(StreamWork(stream_id, taken, closed and not inbox))
            if taken and not inbox and not closed:
                self.connector.rearm(stream_id)  # its chunk consumed: WAITING_FOR_CHUNK
        if self.sched is not None:
            self._schedule_chunks(batch)
        return batch

    def _schedule_chunks(self, batch: list[StreamWork]) -> None:
        """The scheduler's chunk bookkeeping around this ``schedule()`` (every bound
        request visited: ``_vllm_omni_sched``)."""
        assert self.sched is not None
        with self.connector.lock:
            inbox = self.connector.inbox
            ready = {sid for sid in self.running if inbox.get(sid)} | self.more
            finished = set(self.connector.upstream_done)
        ready.update(w.stream_id for w in batch)
        self.sched.schedule(ready, finished, (w.stream_id for w in batch))

    def step(self, batch: list[StreamWork]) -> None:
        try:
            results = dict(self.stage.step(batch))
        except Exception as exc:  # the whole batch fails, as in omnitrio
            results = {w.stream_id: StreamOutput(error=exc) for w in batch}
        arrays = {sid: self._to_host(len(out.payloads)) for sid, out in results.items()}
        if not self.settings.hidden_states_to_orchestrator:  # PR 4527: connector only
            arrays = {sid: [] for sid in arrays}
        for stream_id, out in results.items():
            if out.more:
                self.more.add(stream_id)
            else:
                self.more.discard(stream_id)
            if self.index < self.num_stages - 1:
                self._save(stream_id, out)
            if out.done or out.error is not None:
                self._finish(stream_id)
        step = [_output(sid, out, arrays[sid]) for sid, out in results.items()]
        packaging_s = self.settings.packaging_ms / 1000 if self.index == 1 else 0.0
        if self.packer is not None:  # PR 4476: built beside the loop, which goes on
            self.packer.put((packaging_s, step))
        else:  # seed 002: on the critical path, before the next launch
            hold_gil_for(packaging_s)
            self.outputs.put(step)

    def _to_host(self, units: int) -> list[dict[str, numpy.ndarray[Any, Any]]]:
        """The D2H copy of each unit's arrays (``sample_tokens``' hidden-state copies)."""
        return [{k: v.copy() for k, v in self.device.items()} for _ in range(units)]

    def _save(self, stream_id: str, out: StreamOutput) -> None:
        """Queue a chunk of the stage's own payloads for the next stage (they stand for
        the hidden rows, so the arrays do not travel this way twice)."""
        pending = self.pending.get(stream_id)
        if pending is None:
            return
        pending += out.payloads
        done = out.done or out.error is not None
        if len(pending) < self.frames_per_chunk and not done:
            return
        chunk = self.chunks[stream_id]
        self.chunks[stream_id] = chunk + 1
        self.pending[stream_id] = []
        key = self.connector.key(stream_id, chunk, self.index)
        self.connector.save_async(key, {"payloads": pending, "done": done})

    def _finish(self, stream_id: str) -> None:
        self.running.remove(stream_id)
        if self.sched is not None:
            self.sched.finish(stream_id)
        self.more.discard(stream_id)
        self.pending.pop(stream_id, None)
        self.chunks.pop(stream_id, None)
        self.stage.close_stream(stream_id)
        if self.index > 0:
            self.connector.drop(stream_id)


def hold_gil_for(cpu_s: float) -> None:
    """Python work holding the GIL until this thread has had ``cpu_s`` of CPU (as the
    synthetic stage's host time: a fixed amount of work, slower when contended)."""
    deadline_s = time.thread_time() + cpu_s
    while time.thread_time() < deadline_s:
        pass


def _packer_thread(
    packer: queue.Queue[tuple[float, list[Any]] | None], outputs: queue.Queue[list[Any] | None]
) -> None:
    """PR 4476's background materialization: package each step, then hand it on."""
    while (job := packer.get()) is not None:
        packaging_s, step = job
        hold_gil_for(packaging_s)
        outputs.put(step)


def _output(
    stream_id: str, out: StreamOutput, arrays: list[dict[str, numpy.ndarray[Any, Any]]]
) -> Any:
    """One stream's ``EngineCoreOutput``: header fields plus its arrays (sent as frames)."""
    text = "".join(item.text for item in out.visible if isinstance(item, TextDelta))
    audio = [item for item in out.visible if isinstance(item, AudioChunk)]
    return (
        stream_id,
        text or None,
        audio[0].pcm16 if audio else None,
        audio[0].sample_rate_hz if audio else 0,
        out.done,
        None if out.error is None else f"{type(out.error).__name__}: {out.error}",
        arrays,
    )


def _output_thread(
    outputs: queue.Queue[list[Any] | None], sock: zmq.Socket[Any], sent: Any
) -> None:
    """``process_output_sockets``: msgpack the header, arrays as zero-copy frames."""
    while (step := outputs.get()) is not None:
        frames: list[Any] = []
        header = []
        for stream_id, text, pcm, rate, done, error, arrays in step:
            shapes = []
            for unit in arrays:
                for name, array in unit.items():
                    shapes.append((name, WIRE_DTYPES[str(array.dtype)], array.shape))
                    frames.append(array)
            header.append((stream_id, text, pcm, rate, done, error, shapes))
        sock.send_multipart([msgpack.packb(header), *frames], copy=False)
        sent.value += 1


def _stage_main(
    config: PipelineConfig,
    index: int,
    run_id: str,
    addresses: tuple[str, str],
    settings: ModelSettings,
    sent: Any,
) -> None:
    """A stage process: load the stage, then serve its engine loop until told to stop."""
    context = zmq.Context()
    inbound = context.socket(zmq.PULL)
    inbound.connect(addresses[0])
    outbound = context.socket(zmq.PUSH)
    outbound.setsockopt(zmq.SNDHWM, 0)  # unbounded, as vLLM's make_zmq_socket
    outbound.connect(addresses[1])
    try:
        stage = load_stage(config, index)
    except Exception as exc:
        outbound.send(msgpack.packb(("failed", f"{type(exc).__name__}: {exc}")))
        outbound.close(linger=1000)
        context.term()
        return
    spec = config.stages[index]
    num = len(config.stages)
    # A chunk holds as many units as the next stage takes per step (codec_chunk_frames).
    frames = config.stages[index + 1].params.get("inputs_per_step", 1) if index + 1 < num else 1
    connector = _Connector(run_id, index, settings, sends=index < num - 1)
    outputs: queue.Queue[list[Any] | None] = queue.Queue()
    engine = _Engine(
        index, num, stage, spec.max_batch_size, int(frames), settings, connector, outputs
    )
    threads = [threading.Thread(target=_output_thread, args=(outputs, outbound, sent))]
    if settings.async_output:
        engine.packer = queue.Queue()
        threads.append(threading.Thread(target=_packer_thread, args=(engine.packer, outputs)))
    outbound.send(msgpack.packb(("ready", os.getpid())))
    for thread in threads:
        thread.daemon = True
        thread.start()
    try:
        _engine_loop(engine, inbound)
    finally:
        if engine.packer is not None:
            engine.packer.put(None)
            threads[1].join()
        outputs.put(None)
        threads[0].join()
        connector.stop()
        stage.close()
        inbound.close(linger=0)
        outbound.close(linger=1000)
        context.term()


def _engine_loop(engine: _Engine, inbound: zmq.Socket[Any]) -> None:
    while True:
        while inbound.poll(0):
            message = msgpack.unpackb(inbound.recv())
            if message[0] == "stop":
                return
            if message[0] == "add":
                engine.add(message[1], Request(message[2], options=message[3]))
            else:
                engine.abort(message[1])
        batch = engine.pick()
        if batch:
            engine.step(batch)
        elif engine.running:  # requests waiting for chunks: back off
            inbound.poll(int(IDLE_SLEEP_S * 1000))
        else:  # an idle engine blocks on new requests
            inbound.poll(100)


def _wait_ready(outputs: list[zmq.Socket[Any]], processes: list[BaseProcess]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    for index, sock in enumerate(outputs):
        while not sock.poll(100):
            if not processes[index].is_alive():
                raise TargetError(f"stage process {index} exited ({processes[index].exitcode})")
            if time.monotonic() > deadline:
                raise TargetError(f"stage process {index} not ready in {READY_TIMEOUT_S} s")
        message = msgpack.unpackb(sock.recv())
        if message[0] != "ready":
            raise TargetError(f"stage process {index} could not load its stage: {message[1]}")


def _shut_down(processes: list[BaseProcess], inputs: list[zmq.Socket[Any]]) -> None:
    for sock in inputs:
        sock.send(msgpack.packb(("stop",)))
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join()


def replica_config(config: PipelineConfig, index: int) -> tuple[PipelineConfig, int]:
    """The config one replica process of stage ``index`` loads, and how many there are.

    A synthetic stage's ``replicas: N`` (N GPUs stepping in parallel behind one host
    thread, as omnitrio runs it) is N engine processes in vllm-omni, each with
    ``max_num_seqs`` of its own and its own output socket (``StagePool``'s replicas):
    so the model starts N processes of one replica each, ``max_batch_size / N``.
    """
    spec = config.stages[index]
    count = int(spec.params.get("replicas", 1))
    if count <= 1:
        return config, 1
    one = spec.model_copy(
        update={
            "params": {**spec.params, "replicas": 1},
            "max_batch_size": max(1, spec.max_batch_size // count),
        }
    )
    stages = tuple(one if i == index else s for i, s in enumerate(config.stages))
    return config.model_copy(update={"stages": stages}), count


@asynccontextmanager
async def open_vllm_omni_model(
    config: PipelineConfig, settings: ModelSettings, name: str
) -> AsyncIterator[VllmOmniModel]:
    """Start a process per stage replica and the orchestrator thread; stop them all on exit."""
    run_id = uuid.uuid4().hex[:8]
    spawn = multiprocessing.get_context("spawn")
    context = zmq.Context()
    inputs: list[zmq.Socket[Any]] = []
    outputs: list[zmq.Socket[Any]] = []
    processes: list[BaseProcess] = []
    stage_of: list[int] = []  # each process's stage, in the orchestrator's polling order
    configs: list[PipelineConfig] = []
    for index in range(len(config.stages)):
        one, count = replica_config(config, index)
        stage_of += [index] * count
        configs += [one] * count
    sent = [spawn.Value("q", 0, lock=False) for _ in stage_of]
    with tempfile.TemporaryDirectory(prefix="omnitrio-vo-") as folder:
        try:
            for proc, index in enumerate(stage_of):
                addresses = (f"ipc://{folder}/in{proc}", f"ipc://{folder}/out{proc}")
                inbound = context.socket(zmq.PUSH)
                inbound.setsockopt(zmq.SNDHWM, 0)
                inbound.bind(addresses[0])
                outbound = context.socket(zmq.PULL)
                outbound.setsockopt(zmq.RCVHWM, 0)
                outbound.bind(addresses[1])
                inputs.append(inbound)
                outputs.append(outbound)
                process = spawn.Process(
                    target=_stage_main,
                    args=(configs[proc], index, run_id, addresses, settings, sent[proc]),
                    name=f"vllm-omni-model-{config.stages[index].name}-{proc}",
                    daemon=True,
                )
                process.start()
                processes.append(process)
            await trio.to_thread.run_sync(_wait_ready, outputs, processes)
            from ._vllm_omni_head import VllmOmniModel  # torch: the head process only

            token = trio.lowlevel.current_trio_token()
            model = VllmOmniModel(name, settings, inputs, outputs, sent, token, stage_of)
            await trio.to_thread.run_sync(model.start)
            try:
                yield model
            finally:
                await trio.to_thread.run_sync(model.stop)
        finally:
            await trio.to_thread.run_sync(_shut_down, processes, inputs)
            for sock in inputs + outputs:
                sock.close(linger=0)
            context.term()
