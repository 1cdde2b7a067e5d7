"""The executing half of a stage actor: everything that runs on its worker thread.

``StageRunner`` owns the stage object. It loads it, runs one round's closes,
opens and step, checks each stream's output against the stage's ``StepLimits``,
and closes what finished. It tracks which streams the stage holds, so
``close_stream`` runs exactly once per stream even when a round's result never
reaches trio (a round cut off by shutdown). The deciding half, in trio, is
``StageActor`` (``_actor.py``).

Its records (``_held``, ``_more``, ``_told_closed``) are the authority on what the
stage object holds and on whether a stream has work: the trio side's ``Slot``
(``_slot.py``) keeps a forecast of them, at most one round behind.

Trio plans a round while the previous one still runs, so a plan may hold a stream
whose previous step trio has not seen yet. The runner has seen it: it steps a
planned stream only if the stage still holds it and it has work by the stage's
latest answer (it asked for ``more``, inputs came, or its input closed and the
stage has not been told). Otherwise the stream sits the step out, and trio
returns its reserved credit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._config import StageSpec, resolve_impl
from ._contract import ProtocolError, check_output
from ._errors import StageLoadError
from ._items import Request
from ._stage import Stage, StepLimits, StreamOutput, StreamWork

logger = logging.getLogger(__name__)

_NO_PROGRESS = StreamOutput()


@dataclass(frozen=True)
class Plan:
    """One round's work for the thread, decided in trio."""

    closes: tuple[str, ...]
    opens: tuple[tuple[str, Request], ...]
    batch: tuple[StreamWork, ...]


@dataclass
class Result:
    """What the thread did with a ``Plan``."""

    opened: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    errors: dict[str, Exception] = field(default_factory=dict)
    stepped: list[str] = field(default_factory=list)
    """Streams of the plan's batch that were in the step (the rest sat it out)."""
    outputs: Mapping[str, StreamOutput] = field(default_factory=dict)
    stray: list[str] = field(default_factory=list)
    step_error: Exception | None = None
    busy_s: float = 0.0
    """The whole round on the thread: closes, opens and the step."""
    step_s: float = 0.0
    """The step alone (``stage.step``): what the stage's step-time model learns from."""
    step_ended_s: float = 0.0
    """When the step returned (``perf_counter`` s of the stage's process; 0: no step):
    which of the stage's steps a newcomer's first input waited for."""


class StageRunner:
    """Calls one stage; every method runs on that stage's worker thread."""

    def __init__(self, spec: StageSpec, source: str, *, feeds_edge: bool) -> None:
        self.spec = spec
        self.name = spec.name
        self.limits = StepLimits(0, 0)  # replaced by load()
        self._source = source
        self._feeds_edge = feeds_edge
        self._stage: Stage | None = None
        self._held: set[str] = set()
        self._more: set[str] = set()  # streams whose latest answer was more=True
        self._told_closed: set[str] = set()  # streams already stepped with input_closed

    def model_statistics(self) -> Mapping[str, float]:
        """The stage's own figures (``stage_statistics()``, optional), or none.

        Called from the trio thread: a stage's ``stage_statistics`` must be cheap and
        only read plain attributes (a snapshot, not a computation under a lock).
        """
        report = getattr(self._stage, "stage_statistics", None)
        if report is None:
            return {}
        return {str(k): float(v) for k, v in report().items()}

    def load(self) -> None:
        """Construct the stage (kept even if start-up is cancelled meanwhile, so that
        ``close_all`` still closes it)."""
        factory: Any = resolve_impl(self.spec.impl, self._source, f"stage {self.name}.impl")
        try:
            stage = factory(name=self.name, device=self.spec.device, **self.spec.params)
        except Exception as exc:
            raise StageLoadError(self.name, f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(stage, Stage):
            raise StageLoadError(
                self.name, f"{self.spec.impl} does not implement the Stage protocol"
            )
        try:
            self.limits = StepLimits.of_stage(stage)
        except ValueError as exc:
            raise StageLoadError(self.name, str(exc)) from None
        self._stage = stage

    def execute(self, plan: Plan) -> Result:
        """Closes, then opens, then one batched step, then closes of finished streams."""
        assert self._stage is not None
        stage, result = self._stage, Result()
        started = time.perf_counter()
        for sid in plan.closes:
            self._close(sid, result)
        for sid, request in plan.opens:
            try:
                stage.open_stream(sid, request)
                self._held.add(sid)
                result.opened.append(sid)
            except Exception as exc:
                result.errors[sid] = exc
        batch = [w for w in plan.batch if self._has_work(w)]
        result.stepped = [w.stream_id for w in batch]
        if batch:
            step_started = time.perf_counter()
            self._step(batch, result)
            result.step_ended_s = time.perf_counter()
            result.step_s = result.step_ended_s - step_started
        result.busy_s = time.perf_counter() - started
        return result

    def _has_work(self, work: StreamWork) -> bool:
        sid = work.stream_id
        if sid not in self._held:
            return False  # finished, failed or never opened
        return bool(
            sid in self._more or work.inputs or (work.input_closed and sid not in self._told_closed)
        )

    def _step(self, batch: list[StreamWork], result: Result) -> None:
        assert self._stage is not None
        try:
            outputs = self._stage.step(batch)
            if not isinstance(outputs, Mapping):
                raise ProtocolError(f"step returned a {type(outputs).__name__}, not a mapping")
        except Exception as exc:
            result.step_error = exc
        else:
            result.outputs = {
                w.stream_id: check_output(
                    outputs.get(w.stream_id, _NO_PROGRESS), self.limits, feeds_edge=self._feeds_edge
                )
                for w in batch
            }
            result.stray = sorted(str(k) for k in outputs if k not in result.outputs)
        for work in batch:
            sid = work.stream_id
            if work.input_closed:
                self._told_closed.add(sid)
            output = result.outputs.get(sid)
            if output is not None and output.more:
                self._more.add(sid)
            else:
                self._more.discard(sid)
            if result.step_error or (output and (output.done or output.error)):
                self._close(sid, result)

    def close_all(self) -> None:
        """At shutdown: close every stream the stage holds, then the stage."""
        if self._stage is None:
            return
        result = Result()
        for sid in sorted(self._held):
            self._close(sid, result)
        try:
            self._stage.close()
        except Exception:
            logger.exception("stage %r failed to close", self.name, extra={"stage": self.name})

    def _close(self, sid: str, result: Result) -> None:
        assert self._stage is not None
        result.closed.append(sid)
        if sid not in self._held:
            return  # already closed: close_stream runs exactly once per stream
        self._held.discard(sid)
        self._more.discard(sid)
        self._told_closed.discard(sid)
        try:
            self._stage.close_stream(sid)
        except Exception:
            logger.exception(
                "stage %r failed to close stream %r",
                self.name,
                sid,
                extra={"stage": self.name, "stream": sid},
            )
