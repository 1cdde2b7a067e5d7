"""The turn detector: the pipeline's VAD stage run on every session's live input audio.

A response's stages get the turn's audio all at once, after it is committed;
server_vad needs the opposite — a verdict on audio as it arrives, before there
is any response. So the config's ``turn_detection`` stage runs outside the chain,
here: on its own worker thread, with one stream per listening session. Appended
chunks queue per stream; each turn of the loop hands everything queued, for
every stream, to ONE batched ``step`` (the Stage protocol, via the same
``StageRunner`` the actors use), then delivers each stream's events
(``speech_started`` / ``speech_stopped``) to its session. Nothing polls: the
loop sleeps on an event that ``append`` sets.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial

import trio

from .._config import StageSpec
from .._items import Event, Request, Scalar
from .._runner import Plan, StageRunner
from .._stage import StreamWork
from .._worker import WorkerThread

logger = logging.getLogger(__name__)

MAX_PENDING_CHUNKS = 256
"""Chunks a stream may have queued before the detector takes them (~5 s of 20 ms chunks)."""
EVENT_CAPACITY = 16


class DetectorStream:
    """One session's detection: ``append`` audio, iterate ``events``.

    Made by ``TurnDetector.open``.
    """

    def __init__(self, stream_id: str, generation: int, detector: TurnDetector) -> None:
        self.id = stream_id
        self.generation = generation
        self._detector = detector
        self.pending: list[bytes] = []
        self.failure: str | None = None  # why the detector gave up on this stream
        self._send, self.events = trio.open_memory_channel[Event](EVENT_CAPACITY)
        self.num_dropped_chunks = 0

    def append(self, pcm16: bytes) -> None:
        """Queue audio for the next detector step. Never blocks: a detector that falls
        more than ``MAX_PENDING_CHUNKS`` behind drops this stream's oldest chunk (logged)."""
        if len(self.pending) >= MAX_PENDING_CHUNKS:
            self.pending.pop(0)
            self.num_dropped_chunks += 1
            logger.warning("turn detector is behind; dropped audio", extra={"stream": self.id})
        self.pending.append(pcm16)
        self._detector.wake()

    def deliver(self, event: Event) -> None:
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            logger.error("session is not taking turn events; dropped %s", event.name)
        except trio.ClosedResourceError:
            pass  # the session closed it meanwhile; nobody is listening

    def close(self) -> None:
        """Stop listening (idempotent); the stage frees the stream at its next turn."""
        self._send.close()
        self._detector.drop(self)


class TurnDetector:
    """Runs the turn-detection stage; see the module docstring."""

    def __init__(self, spec: StageSpec, source: str) -> None:
        self.name = spec.name
        self._runner = StageRunner(spec, source, has_outbox=False)
        self._ids = itertools.count()
        self._streams: dict[str, DetectorStream] = {}
        self._opens: list[tuple[str, Request]] = []
        self._closes: list[str] = []
        self._wakeup = trio.Event()
        self.num_steps = 0
        self.busy_s = 0.0

    @property
    def num_streams(self) -> int:
        """Sessions listened to right now."""
        return len(self._streams)

    def wake(self) -> None:
        self._wakeup.set()

    def open(self, generation: int, options: Mapping[str, Scalar]) -> DetectorStream:
        stream = DetectorStream(f"vad{next(self._ids)}", generation, self)
        self._streams[stream.id] = stream
        self._opens.append((stream.id, Request(options=options)))
        self.wake()
        return stream

    def drop(self, stream: DetectorStream) -> None:
        if self._streams.pop(stream.id, None) is not None:
            self._closes.append(stream.id)
            self.wake()

    async def run(self, shutdown_timeout_s: float, *, task_status: trio.TaskStatus[None]) -> None:
        """Load the stage on its thread, report ready, serve until cancelled, then close
        every stream and the stage and join the thread (shielded, bounded)."""
        worker = WorkerThread(f"omnitrio-turns-{self.name}")
        try:
            await worker.run(self._runner.load)
            task_status.started()
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                await self._turn(worker)
        finally:
            with trio.CancelScope(shield=True):
                deadline = trio.current_time() + shutdown_timeout_s
                with trio.move_on_at(deadline):
                    await worker.run(self._runner.close_all)
                if not await worker.stop(deadline):
                    logger.error("turn detector %r did not stop in time", self.name)

    async def _turn(self, worker: WorkerThread) -> None:
        batch = []
        for stream in self._streams.values():
            if stream.pending:
                batch.append(StreamWork(stream.id, tuple(stream.pending), False))
                stream.pending = []
        plan = Plan(tuple(self._closes), tuple(self._opens), tuple(batch))
        self._closes, self._opens = [], []
        if not (plan.closes or plan.opens or plan.batch):
            return
        started = time.perf_counter()
        result = await worker.run(partial(self._runner.execute, plan))
        self.num_steps += 1
        self.busy_s += time.perf_counter() - started
        for sid, error in result.errors.items():
            self._fail(sid, "could not open the stream", error)
        if result.step_error is not None:
            for work in plan.batch:
                self._fail(work.stream_id, "its step failed", result.step_error)
        for sid, output in result.outputs.items():
            listener = self._streams.get(sid)
            if listener is None:
                continue
            if output.error is not None:
                self._fail(sid, "it failed the stream", output.error)
            for item in output.visible:
                if isinstance(item, Event):
                    listener.deliver(item)

    def _fail(self, sid: str, what: str, error: Exception) -> None:
        """Log the error; the session hears only ``what`` (no internals go to clients)."""
        stream = self._streams.get(sid)
        logger.error(
            "turn detector %r, stream %s: %s",
            self.name,
            sid,
            what,
            exc_info=error,
            extra={"stage": self.name, "stream": sid},
        )
        if stream is not None:
            stream.failure = f"the turn detector {self.name!r}: {what}"
            stream.close()


@asynccontextmanager
async def open_turn_detector(
    spec: StageSpec | None, source: str, shutdown_timeout_s: float
) -> AsyncIterator[TurnDetector | None]:
    """A running ``TurnDetector`` for ``spec`` (None when the pipeline has none).

    Blocks until the stage has loaded; leaving the block stops it and joins its thread.
    """
    if spec is None:
        yield None
        return
    detector = TurnDetector(spec, source)
    async with trio.open_nursery() as nursery:
        await nursery.start(detector.run, shutdown_timeout_s)
        try:
            yield detector
        finally:
            nursery.cancel_scope.cancel()
