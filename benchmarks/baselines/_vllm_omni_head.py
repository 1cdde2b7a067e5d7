"""The vllm-omni model's head process: its orchestrator thread and its API server thread.

Both run an asyncio loop of their own, as vllm-omni's do, in the benchmark's
process (so they share its GIL with each other, as they share the API server
process's in vllm-omni):

- **The orchestrator thread** (``AsyncOmniEngine``'s thread running
  ``Orchestrator.run``): a reader task per stage (``AsyncMPClient``'s
  ``process_outputs_socket``: msgpack, a tensor hook per array) feeding that
  stage's ``outputs_queue``; a ``_request_handler`` task taking adds and aborts
  from the request queue, submitting to stage 0 and then prewarming the later
  stages (``_prewarm_async_chunk_stages``); and the ``_orchestration_loop``:
  ``asyncio.wait_for(queue.get(), 1 ms)`` on each stage in turn (one output per
  stage per round, a Task per call on Python 3.11), a 1 ms sleep after an idle
  round. With ``event_driven`` (PR #5221) the readers feed one dispatch queue the
  loop awaits instead. Each output goes through ``_vllm_omni_outputs`` (the
  output processor's per-request work) and ``_route_output``, which puts the
  final stages' outputs on the output queue (janus in vllm-omni).
- **The API server thread**: the final-output dispatcher (``get_nowait`` and a
  1 ms sleep; a wake-up with ``event_driven``) hands each output to its request's
  task, which does what ``serving_chat`` does per chunk (``_vllm_omni_outputs``)
  before the client sees it.
"""

from __future__ import annotations

import asyncio
import math
import queue
import time
from typing import Any

import msgpack  # type: ignore[import-untyped]
import torch
import trio
import zmq
import zmq.asyncio

from ..harness._clients import Delivery, deliver, follow
from ..harness._target import Prompt, Sample, Timeline, rss_bytes_of_self
from ._vllm_omni_loop import ThreadLoop
from ._vllm_omni_outputs import OutputMessage, RequestState, StageOutput, chat_chunk_json
from ._vllm_omni_settings import ModelSettings

POLL_TIMEOUT_S = 0.001  # the orchestrator's wait on each empty stage
IDLE_SLEEP_S = 0.001  # after an idle round; the final-output dispatcher's poll too


class VllmOmniModel:
    """Stage processes (started by the caller) driven by the head's two threads."""

    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        inputs: list[zmq.Socket[Any]],
        outputs: list[zmq.Socket[Any]],
        sent: list[Any],
        token: trio.lowlevel.TrioToken,
        stage_of: list[int],
    ) -> None:
        """``inputs``, ``outputs`` and ``sent`` are per process; ``stage_of`` names each
        process's stage (a stage's replicas are consecutive, in polling order)."""
        self.name = name
        self._settings = settings
        self._inputs = inputs
        self._outputs = outputs
        self._sent = sent  # steps each stage process has sent (shared counters)
        self._token = token
        self._stage_of = stage_of
        self._num_stages = max(stage_of) + 1
        self._replicas = [
            [proc for proc, s in enumerate(stage_of) if s == stage]
            for stage in range(self._num_stages)
        ]
        self._next_replica = [0] * self._num_stages  # StagePool's sticky round robin
        self._bound: dict[str, list[int]] = {}  # request -> its process at each stage
        self._processed = [0] * len(outputs)
        self._batch_sizes = [0] * len(outputs)
        self._stalls_s = [0.0] * len(outputs)  # longest _process since the last sample
        self._states: dict[str, RequestState] = {}  # the orchestrator thread's own
        self._open: set[str] = set()
        self._ids = 0
        self._output_queue: queue.Queue[OutputMessage] = queue.Queue()  # janus output_queue
        self._orchestrator = ThreadLoop("vllm-omni-orchestrator", self._orchestrator_main)
        self._api = ThreadLoop("vllm-omni-api-server", self._api_main)
        self._requests: asyncio.Queue[tuple[str, str, RequestState | None]] | None = None
        self._api_queues: dict[str, asyncio.Queue[OutputMessage]] = {}
        self._api_wakeup: asyncio.Event | None = None

    def start(self) -> None:
        self._api.start()
        self._orchestrator.start()

    def stop(self) -> None:
        self._orchestrator.stop()
        self._api.stop()

    # ------------------------------------------------------------ the caller's side

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        self._ids += 1
        stream_id = f"r{self._ids}"
        send, receive = trio.open_memory_channel[Delivery](math.inf)
        request = prompt.request()
        state = RequestState(
            stream_id, request.text, request.options.as_mapping(), self._num_stages
        )
        self._open.add(stream_id)
        self._api.call(self._api_open, stream_id, send)
        self._orchestrator.call(self._submit, "add", stream_id, state)
        await follow(receive, timeline, lambda completed: self._forget(stream_id, completed))

    def _forget(self, stream_id: str, completed: bool) -> None:
        self._open.discard(stream_id)
        if not completed:  # failed or abandoned: abort it through the orchestrator
            self._orchestrator.call(self._submit, "abort", stream_id, None)

    def _label(self, proc: int) -> str:
        stage = self._stage_of[proc]
        replicas = self._replicas[stage]
        return f"stage{stage}" if len(replicas) == 1 else f"stage{stage}.{replicas.index(proc)}"

    async def sample(self) -> Sample:
        depth = {  # outputs sent by a stage replica and not yet processed by the orchestrator
            f"{self._label(i)}.outputs": int(sent.value) - self._processed[i]
            for i, sent in enumerate(self._sent)
        }
        stalls, self._stalls_s = self._stalls_s, [0.0] * len(self._stalls_s)
        return Sample(
            at_s=0.0,
            open_streams=len(self._open),
            queue_depth=depth,
            batch_size={self._label(i): float(b) for i, b in enumerate(self._batch_sizes)},
            rss_bytes=rss_bytes_of_self(),
            stall_ms={self._label(i): s * 1000 for i, s in enumerate(stalls)},
        )

    # ------------------------------------------------------------ orchestrator thread

    def _submit(self, kind: str, stream_id: str, state: RequestState | None) -> None:
        assert self._requests is not None
        self._requests.put_nowait((kind, stream_id, state))  # janus request_queue.put

    async def _orchestrator_main(self) -> None:
        self._requests = asyncio.Queue()
        inputs = [zmq.asyncio.Socket.from_socket(s) for s in self._inputs]
        outputs = [zmq.asyncio.Socket.from_socket(s) for s in self._outputs]
        queues: list[asyncio.Queue[tuple[int, list[StageOutput]]]] = [
            asyncio.Queue() for _ in outputs
        ]
        dispatch: asyncio.Queue[tuple[int, list[StageOutput]]] = asyncio.Queue()
        async with asyncio.TaskGroup() as tasks:
            for index, sock in enumerate(outputs):
                target = dispatch if self._settings.event_driven else queues[index]
                tasks.create_task(self._read_outputs(index, sock, target))
            tasks.create_task(self._request_handler(inputs))
            if self._settings.event_driven:
                tasks.create_task(self._dispatch_loop(dispatch))
            else:
                tasks.create_task(self._orchestration_loop(queues))

    async def _read_outputs(
        self,
        index: int,
        sock: zmq.asyncio.Socket,
        target: asyncio.Queue[tuple[int, list[StageOutput]]],
    ) -> None:
        """``process_outputs_socket``: decode each step's outputs, queue them."""
        while True:
            frames = await sock.recv_multipart(copy=False)
            target.put_nowait((index, _decode(frames)))

    async def _request_handler(self, inputs: list[zmq.asyncio.Socket]) -> None:
        assert self._requests is not None
        while True:
            kind, stream_id, state = await self._requests.get()
            if kind == "add":
                assert state is not None
                if stream_id not in self._open:
                    continue  # gone before it was admitted
                self._states[stream_id] = state
                bound = []
                for stage, replicas in enumerate(self._replicas):  # select_replica_id
                    bound.append(replicas[self._next_replica[stage] % len(replicas)])
                    self._next_replica[stage] += 1
                self._bound[stream_id] = bound
                add = msgpack.packb(("add", stream_id, state.prompt, state.options))
                await inputs[bound[0]].send(add)  # submit_initial on stage 0
                for proc in bound[1:]:  # _prewarm_async_chunk_stages
                    await inputs[proc].send(add)
            elif self._states.pop(stream_id, None) is not None:
                abort = msgpack.packb(("abort", stream_id))
                for proc in self._bound.pop(stream_id, []):  # _cleanup_request_ids(abort=True)
                    await inputs[proc].send(abort)

    async def _orchestration_loop(
        self, queues: list[asyncio.Queue[tuple[int, list[StageOutput]]]]
    ) -> None:
        while True:
            idle = True
            for pending in queues:  # at most one raw output per stage replica per round
                try:
                    index, outputs = await asyncio.wait_for(pending.get(), POLL_TIMEOUT_S)
                except TimeoutError:
                    continue
                idle = False
                self._process(index, outputs)
            await asyncio.sleep(IDLE_SLEEP_S if idle else 0)

    async def _dispatch_loop(self, dispatch: asyncio.Queue[tuple[int, list[StageOutput]]]) -> None:
        while True:
            index, outputs = await dispatch.get()
            self._process(index, outputs)

    def _process(self, proc: int, outputs: list[StageOutput]) -> None:
        """``process_llm_raw_outputs``, then ``_route_output`` for each request's output.

        Its duration is what one step's outputs block the orchestrator's loop for (its
        longest per sampling window is the sample's ``stall_ms``): the thinker's, when
        a batch of requests finishes at once, includes their rows' concatenation."""
        started_s = time.perf_counter()
        self._processed[proc] += 1
        self._batch_sizes[proc] = len(outputs)
        stage = self._stage_of[proc]
        final = (0, self._num_stages - 1)  # text from the thinker, audio from the last
        for output in outputs:
            state = self._states.get(output.stream_id)
            if state is None:
                continue
            message = state.process(stage, output)
            if message.done_all or message.error is not None:
                del self._states[output.stream_id]
                self._bound.pop(output.stream_id, None)
            if stage in final or message.done_all or message.error is not None:
                self._output_queue.put(message)  # the janus output_queue
                if self._settings.event_driven:
                    self._api.call(self._wake_api)
        stalls = self._stalls_s  # the sampler may swap in a fresh list meanwhile
        stalls[proc] = max(stalls[proc], time.perf_counter() - started_s)

    # ------------------------------------------------------------ API server thread

    async def _api_main(self) -> None:
        self._api_wakeup = asyncio.Event()
        while True:  # the final-output dispatcher
            try:
                message = self._output_queue.get_nowait()
            except queue.Empty:
                if self._settings.event_driven:
                    await self._api_wakeup.wait()
                    self._api_wakeup.clear()
                else:
                    await asyncio.sleep(IDLE_SLEEP_S)
                continue
            pending = self._api_queues.get(message.request_id)
            if pending is not None:
                pending.put_nowait(message)  # the request's unbounded asyncio.Queue

    def _wake_api(self) -> None:
        if self._api_wakeup is not None:
            self._api_wakeup.set()

    def _api_open(self, stream_id: str, send: trio.MemorySendChannel[Delivery]) -> None:
        pending: asyncio.Queue[OutputMessage] = asyncio.Queue()
        self._api_queues[stream_id] = pending
        asyncio.get_running_loop().create_task(self._serve_chat(stream_id, pending, send))

    async def _serve_chat(
        self,
        stream_id: str,
        pending: asyncio.Queue[OutputMessage],
        send: trio.MemorySendChannel[Delivery],
    ) -> None:
        """``generate`` then ``serving_chat``'s stream: one JSON chunk per output."""
        try:
            while True:
                message = await pending.get()
                if message.error is not None:
                    deliver(self._token, send, RuntimeError(message.error))
                    return
                for item in message.items:
                    chat_chunk_json(stream_id, item)  # what the server writes per chunk
                    deliver(self._token, send, item)
                if message.done_all:
                    deliver(self._token, send, None)
                    return
        finally:
            del self._api_queues[stream_id]


def _decode(frames: list[Any]) -> list[StageOutput]:
    """vLLM's ``MsgpackDecoder`` on one step: the header, then a tensor per array frame
    (``_decode_tensor``: the received bytes copied into a buffer the tensor owns,
    ``torch.frombuffer`` as uint8, viewed as its dtype and shape)."""
    header = msgpack.unpackb(frames[0].buffer)
    outputs = []
    at = 1
    for stream_id, text, pcm, rate, done, error, shapes in header:
        arrays: dict[str, torch.Tensor] = {}
        for name, dtype, shape in shapes:  # the tensor hook
            flat = torch.frombuffer(bytearray(frames[at].buffer), dtype=torch.uint8)
            arrays[name] = flat.view(getattr(torch, dtype)).view(shape)
            at += 1
        outputs.append(StageOutput(stream_id, text, pcm, rate, done, error, arrays))
    return outputs
