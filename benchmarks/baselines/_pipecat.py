"""The Pipecat baseline: the same stage objects as frame processors in one Pipecat pipeline.

Pipecat (``pipecat-ai``, the optional ``bench`` extra) runs one pipeline per
call on an asyncio loop; here that loop runs on its own thread, and every
request is a ``Pipeline([stage processors..., sink])`` run by a
``PipelineWorker``. Each stage processor hands its stage's ``step`` to the
stage's one executor thread (a model serves one step at a time) with a batch
of one: Pipecat has no batching across calls. Payloads travel downstream as
frames through Pipecat's frame queues (unbounded); text deltas become
``TextFrame`` and audio ``OutputAudioRawFrame``. Nothing is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from pipecat.frames.frames import DataFrame, EndFrame, Frame, OutputAudioRawFrame, TextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from omnitrio import AudioChunk, PipelineConfig, Request, Stage, StreamWork, TextDelta

from ..harness._stages import load_stages
from ..harness._target import Prompt, Sample, TargetError, Timeline, rss_bytes_of_self


@dataclass
class PromptFrame(DataFrame):  # type: ignore[misc,unused-ignore]
    request: Request | None = None


@dataclass
class PayloadFrame(DataFrame):  # type: ignore[misc,unused-ignore]
    payloads: tuple[object, ...] = ()
    done: bool = False  # the upstream stage finished the stream


class StageProcessor(FrameProcessor):  # type: ignore[misc,unused-ignore]
    """One stage as a frame processor: steps it (batch of one) on its executor thread."""

    def __init__(
        self, stage: Stage, executor: concurrent.futures.Executor, stream_id: str, first: bool
    ) -> None:
        super().__init__()
        self._stage, self._executor, self._sid, self._first = stage, executor, stream_id, first
        self._pending: list[object] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, PromptFrame):
            await self._call(self._stage.open_stream, self._sid, frame.request)
            await self.push_frame(frame, direction)  # the next stages open the stream too
            if self._first:
                await self._run(closed=True)
        elif isinstance(frame, PayloadFrame):
            self._pending += frame.payloads
            await self._run(closed=frame.done)
        else:
            await self.push_frame(frame, direction)

    async def _run(self, closed: bool) -> None:
        """Step while there is work: a source until done, others over what has arrived."""
        while True:
            limit = self._stage.max_inputs_per_step or len(self._pending)
            taken, self._pending = self._pending[:limit], self._pending[limit:]
            work = StreamWork(self._sid, tuple(taken), closed and not self._pending)
            out = (await self._call(self._stage.step, [work]))[self._sid]
            if out.error is not None:
                raise out.error
            for item in out.visible:
                if isinstance(item, TextDelta):
                    await self.push_frame(TextFrame(text=item.text))
                elif isinstance(item, AudioChunk):
                    await self.push_frame(
                        OutputAudioRawFrame(item.pcm16, item.sample_rate_hz, num_channels=1)
                    )
            if out.payloads or out.done:
                await self.push_frame(PayloadFrame(payloads=out.payloads, done=out.done))
            if out.done:
                await self._call(self._stage.close_stream, self._sid)
                return
            if not out.more and not self._pending:
                return

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


class Sink(FrameProcessor):  # type: ignore[misc,unused-ignore]
    """The end of the pipeline: stamps what a client would receive."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self._timeline = timeline

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TextFrame):
            self._timeline.text()
        elif isinstance(frame, OutputAudioRawFrame):
            self._timeline.audio_chunk(len(frame.audio) / 2 / frame.sample_rate)
        else:
            await self.push_frame(frame, direction)


class PipecatTarget:
    name = "pipecat"

    def __init__(self, stages: Sequence[Stage], loop: asyncio.AbstractEventLoop) -> None:
        self._stages = stages
        self._executors = [concurrent.futures.ThreadPoolExecutor(1) for _ in stages]
        self._loop = loop
        self._ids = itertools.count()
        self._open = 0

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        sid = f"pc{next(self._ids)}"
        request = prompt.request()
        processors = [
            StageProcessor(stage, executor, sid, first=index == 0)
            for index, (stage, executor) in enumerate(
                zip(self._stages, self._executors, strict=True)
            )
        ]
        future = asyncio.run_coroutine_threadsafe(
            self._run(processors, timeline, request), self._loop
        )
        self._open += 1
        try:
            await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except Exception as exc:
            raise TargetError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._open -= 1
            future.cancel()

    async def _run(
        self, processors: list[StageProcessor], timeline: Timeline, request: Request
    ) -> None:
        worker = PipelineWorker(
            Pipeline([*processors, Sink(timeline)]),
            idle_timeout_secs=None,
            check_dangling_tasks=False,
            enable_rtvi=False,
            enable_turn_tracking=False,
        )
        await worker.queue_frames([PromptFrame(request=request), EndFrame()])
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await runner.run()

    async def sample(self) -> Sample:
        return Sample(0.0, self._open, {}, {}, rss_bytes_of_self())

    def close(self) -> None:
        for executor in self._executors:
            executor.shutdown(wait=True)
        for stage in self._stages:
            stage.close()


@asynccontextmanager
async def open_pipecat(config: PipelineConfig) -> AsyncIterator[PipecatTarget]:
    """Start an asyncio loop on a thread and serve requests as Pipecat pipelines."""
    from loguru import logger  # pipecat's logger: its per-frame DEBUG lines would drown the run

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    stages = await trio.to_thread.run_sync(load_stages, config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="pipecat-loop", daemon=True)
    thread.start()
    target = PipecatTarget(stages, loop)
    try:
        yield target
    finally:
        stopping = asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop)
        await trio.to_thread.run_sync(stopping.result)
        loop.call_soon_threadsafe(loop.stop)
        await trio.to_thread.run_sync(thread.join)
        await trio.to_thread.run_sync(target.close)
        loop.close()
