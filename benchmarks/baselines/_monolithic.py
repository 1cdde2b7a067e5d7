"""The monolithic baseline: one request at a time, every stage to the end before the next.

This is seed 004's no-async-chunk reference (transformers' ``generate(return_audio=True)``
works this way): nothing is streamed, so the client gets all text and audio at
the end. The hook is a *factory*, named as ``module:function`` with
``--monolithic``, called once as ``factory(config)`` on a worker thread; it returns
a callable taking a ``Request`` and returning its visible items (and may have a
``close()``). ``sequential`` below is the built-in factory: it runs the config's
own stage objects one after another, so it works for any chain config. A model
stage module can offer its own (say, ``stages.qwen3_omni:reference_generate``
calling transformers' ``generate`` on the same weights).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from omnitrio import (
    AudioChunk,
    PipelineConfig,
    Request,
    Stage,
    StreamWork,
    TextDelta,
    VisibleItem,
    resolve_impl,
)

from ..harness._stages import load_stages
from ..harness._target import Prompt, Sample, TargetError, Timeline, rss_bytes_of_self

Generate = Callable[[Request], Sequence[VisibleItem]]
SEQUENTIAL = "benchmarks.baselines._monolithic:sequential"


class _Sequential:
    """Runs a chain of stages for one request, stage after stage, batch of one."""

    def __init__(self, stages: list[Stage]) -> None:
        self._stages = stages

    def __call__(self, request: Request) -> list[VisibleItem]:
        visible: list[VisibleItem] = []
        payloads: list[object] = []
        for index, stage in enumerate(self._stages):
            stage.open_stream("mono", request)
            try:
                payloads = self._run(stage, index == 0, payloads, visible)
            finally:
                stage.close_stream("mono")
        return visible

    @staticmethod
    def _run(
        stage: Stage, first: bool, inputs: list[object], visible: list[VisibleItem]
    ) -> list[object]:
        pending = deque(inputs)
        outputs: list[object] = []
        while True:
            limit = stage.max_inputs_per_step or len(pending)
            taken = (
                () if first else tuple(pending.popleft() for _ in range(min(limit, len(pending))))
            )
            out = stage.step([StreamWork("mono", taken, not pending)])["mono"]
            if out.error is not None:
                raise out.error
            outputs += out.payloads
            visible += out.visible
            if out.done:
                return outputs
            if not out.more and not pending:
                raise RuntimeError("stage answered neither more nor done after its input closed")

    def close(self) -> None:
        for stage in self._stages:
            stage.close()


def sequential(config: PipelineConfig) -> _Sequential:
    """The built-in factory: the config's stages run one after another (blocking)."""
    return _Sequential(load_stages(config))


class MonolithicTarget:
    """Serves one request at a time on one worker thread; delivers everything at the end."""

    def __init__(self, generate: Generate, name: str) -> None:
        self.name = name
        self._generate = generate
        self._one_at_a_time = trio.CapacityLimiter(1)
        self._num_waiting = 0

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        request = prompt.request()
        self._num_waiting += 1
        try:
            items = await trio.to_thread.run_sync(
                self._generate, request, limiter=self._one_at_a_time
            )
        except Exception as exc:  # the request fails; the message names the cause
            raise TargetError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._num_waiting -= 1
        for item in items:
            if isinstance(item, TextDelta):
                timeline.text()
            elif isinstance(item, AudioChunk):
                timeline.audio_chunk(item.duration_s)

    async def sample(self) -> Sample:
        return Sample(0.0, self._num_waiting, {}, {}, rss_bytes_of_self())


@asynccontextmanager
async def open_monolithic(
    config: PipelineConfig, factory_name: str = SEQUENTIAL
) -> AsyncIterator[MonolithicTarget]:
    factory: Any = resolve_impl(factory_name, "--monolithic", "factory")
    generate = await trio.to_thread.run_sync(factory, config)
    name = "sequential" if factory_name == SEQUENTIAL else f"monolithic:{factory_name}"
    try:
        yield MonolithicTarget(generate, name)
    finally:
        close = getattr(generate, "close", None)
        if callable(close):
            await trio.to_thread.run_sync(close)
