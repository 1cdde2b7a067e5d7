"""The pipeline's side stage as the server uses it: turn detection (server_vad).

A response's stages get the turn's audio all at once, after it is committed;
server_vad needs the opposite — a verdict on audio as it arrives, before there
is any response. So the config's ``side_stage`` (a VAD) runs outside the
chain, as the pipeline's *side stage*: on the same actor machinery as every
stage (its own worker thread, plan/execute/apply, credit, watchdog, statistics,
shutdown), with one side stream per listening session. Appended chunks wait on
the stream's input edge; each turn hands what waits, for every stream, to ONE
batched ``step``; the stream's events (``speech_started`` / ``speech_stopped``)
reach its session over the stream's bounded client link. A session that does
not take its events holds the stage back for its own stream only (no event is
dropped); audio beyond the input edge's capacity is dropped and logged.

Input gate: a side stage class may say which appended chunks can change anything it
reports, with a classmethod ``input_gate(params)`` that returns, for each new stream,
an object (or None: no gate) whose ``take(num_samples)`` is called per chunk (PCM16
samples) and returns whether the chunks held so far must go to the stage now. The
chunks it holds go with the next one it lets through, joined into one input (the
VAD's ``WindowGate``: a chunk that completes no 32 ms window is not worth a round of
the stage; its resampler puts out the same samples for the joined chunk).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol, Self

import trio

from .._config import resolve_impl
from .._errors import PipelineClosed, StageCall, StageError
from .._items import Event, Request, Scalar
from .._options import ResponseOptions
from .._pipeline import Pipeline
from .._side_stream import SideStream
from .._statistics import StageStatistics

logger = logging.getLogger(__name__)

_WHAT: Mapping[StageCall, str] = {
    "open_stream": "could not open the stream",
    "watchdog": "it is hung",
}


class InputGate(Protocol):
    """Which appended chunks go to the side stage now (see the module docstring)."""

    def take(self, num_samples: int) -> bool: ...


class SessionSideStream:
    """One session's detection: ``append`` audio, iterate it for events.

    Made by ``SideStage.open``.
    """

    def __init__(
        self, side: SideStream, generation: int, stage: str, gate: InputGate | None = None
    ) -> None:
        self.id = side.id
        self.generation = generation
        self.failure: str | None = None  # why the detector gave up on this stream
        self._side = side
        self._stage = stage
        self._gate = gate
        self._held: list[bytes] = []  # chunks the gate holds back, in order

    @property
    def num_dropped_chunks(self) -> int:
        return self._side.num_dropped

    def append(self, pcm16: bytes) -> None:
        """Queue audio for the next detector step (or hold it, where the stage's input
        gate says it changes nothing yet). Never blocks (see the module docstring)."""
        gate = self._gate
        if gate is None:
            self._side.append(pcm16)
        elif gate.take(len(pcm16) // 2):
            if self._held:  # one input: the input edge holds no more items than before
                self._held.append(pcm16)
                pcm16 = b"".join(self._held)
                self._held.clear()
            self._side.append(pcm16)
        else:
            self._held.append(pcm16)

    def close(self) -> None:
        """Stop listening (idempotent); the stage frees the stream at its next turn."""
        self._side.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        """The next event; ends when the stream closes or fails (then ``failure`` says
        why, in words for the client: the details are in the log)."""
        while True:
            try:
                item = await self._side.stream.receive()
            except StageError as exc:
                self.failure = (
                    f"the turn detector {self._stage!r}: {_WHAT.get(exc.during, 'its step failed')}"
                )
                raise StopAsyncIteration from None
            except (trio.ClosedResourceError, PipelineClosed):
                raise StopAsyncIteration from None
            if isinstance(item, Event):
                return item


class SideStage:
    """The pipeline's side stage, opened per session; see the module docstring."""

    def __init__(self, pipeline: Pipeline, stage: str) -> None:
        self.name = stage
        self._pipeline = pipeline
        self._new_gate = _gate_factory(pipeline)

    @classmethod
    def of(cls, pipeline: Pipeline) -> SideStage | None:
        """The pipeline's side stage, or None when its config has none."""
        stage = pipeline.side_stage
        return None if stage is None else cls(pipeline, stage)

    def statistics(self) -> StageStatistics:
        stats = self._pipeline.statistics().side_stage
        assert stats is not None
        return stats

    def open(self, generation: int, options: Mapping[str, Scalar]) -> SessionSideStream:
        side = self._pipeline.open_side_stream(Request(options=ResponseOptions(knobs=options)))
        gate = None if self._new_gate is None else self._new_gate()
        return SessionSideStream(side, generation, self.name, gate)


def _gate_factory(pipeline: Pipeline) -> Callable[[], InputGate | None] | None:
    """The side stage class's ``input_gate`` with its configured params, or None (no
    gate: every chunk goes to the stage at once)."""
    spec = pipeline.config.side_stage
    if spec is None:
        return None
    try:
        stage_class = resolve_impl(spec.impl, pipeline.config.source, "side_stage.impl")
        input_gate = getattr(stage_class, "input_gate", None)
        if input_gate is None:
            return None
        params = dict(spec.params)
        if input_gate(params) is None:  # a bad param fails here, once, not in every session
            return None
    except Exception:
        logger.warning("side stage %r: no input gate", spec.name, exc_info=True)
        return None
    return lambda: input_gate(params)
