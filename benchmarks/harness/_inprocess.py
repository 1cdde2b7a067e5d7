"""The omnitrio target in-process: a pipeline opened through the Python API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from omnitrio import (
    AudioChunk,
    OmnitrioError,
    Overloaded,
    Pipeline,
    PipelineConfig,
    TextDelta,
    open_pipeline,
)

from ._target import Prompt, Refused, Sample, TargetError, Timeline, rss_bytes_of_self


class PipelineTarget:
    """Streams through ``Pipeline.open_stream``; samples ``pipeline.occupancy()``."""

    def __init__(self, pipeline: Pipeline, name: str = "omnitrio") -> None:
        self.name = name
        self._pipeline = pipeline

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        request = prompt.request()
        try:
            async with self._pipeline.open_stream(request) as stream:
                async for item in stream:
                    if isinstance(item, TextDelta):
                        timeline.text()
                    elif isinstance(item, AudioChunk):
                        timeline.audio_chunk(item.duration_s)
                        await timeline.consume(item.duration_s)
        except Overloaded as exc:
            raise Refused(str(exc), exc.retry_after_s) from exc
        except OmnitrioError as exc:
            raise TargetError(str(exc)) from exc

    async def sample(self) -> Sample:
        # Not ``statistics()``: at 64 streams it holds the trio thread a millisecond or
        # more (every stage's model), the run's own clients and stages waiting meanwhile.
        now = self._pipeline.occupancy()
        return Sample(
            at_s=0.0,
            open_streams=now.num_open_streams,
            queue_depth=dict(now.queue_depth),
            batch_size={n: float(b) for n, b in now.last_batch_size.items()},
            rss_bytes=rss_bytes_of_self(),
        )


@asynccontextmanager
async def open_pipeline_target(
    config: PipelineConfig, name: str = "omnitrio"
) -> AsyncIterator[PipelineTarget]:
    async with open_pipeline(config) as pipeline:
        yield PipelineTarget(pipeline, name)
