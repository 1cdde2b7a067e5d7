"""The stage protocol: what a model stage implements and what it is handed.

A stage is a plain synchronous object. The runtime owns one per configured
stage and calls it from that stage's dedicated worker thread only, so a stage
needs no locks. Call order for one stream::

    open_stream(id, request)        # allocate per-stream state (KV cache, buffers)
    step([... StreamWork(id) ...])  # zero or more times, batched with other streams
    close_stream(id)                # always, exactly once: finished, failed or cancelled

``close()`` is called once when the pipeline stops, after every stream is closed.

Inside ``step`` a stage returns one ``StreamOutput`` per stream it made progress
on. ``payloads`` go to the next stage over the edge (never to the client);
``visible`` items go to the stream's client. A stream's work at a stage ends when
the stage returns ``done=True``. ``more=True`` asks for another step even without
new input (an autoregressive decoder); otherwise the stream is stepped again only
when new input arrives or its input closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ._items import Request, VisibleItem


@dataclass(frozen=True, slots=True)
class StreamWork:
    """One stream's share of a batched step.

    ``inputs`` are the payloads that arrived on the incoming edge since the last
    step, in order (always empty for the first stage). ``input_closed`` is true
    once the upstream stage has finished the stream and nothing more will come
    (always true for the first stage).
    """

    stream_id: str
    inputs: tuple[object, ...]
    input_closed: bool


@dataclass(frozen=True, slots=True)
class StreamOutput:
    """What one step did for one stream.

    ``error`` set means the stage could not do this stream's work: the stream
    fails with a ``StageError`` naming the stage, the other streams go on.
    """

    payloads: tuple[object, ...] = ()
    visible: tuple[VisibleItem, ...] = ()
    more: bool = False
    done: bool = False
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class StepLimits:
    """What one step may take and emit for one stream: as a stage class declares it for
    a config's params (``step_limits``), so the config's capacities are checked when it
    is parsed, before any stage loads; and as the loaded stage has it (``of_stage``), what
    the scheduler reserves credit by and each step's output is held to."""

    max_payloads_per_step: int
    max_visible_per_step: int
    max_inputs_per_step: int | None = None  # None: everything waiting
    ends_without_input: bool = False
    """A stream whose input ends before any item came has nothing to do at this stage
    (the loaded stage's optional ``ends_without_input``): the runtime ends it there on
    trio at once, without opening it or waiting for a step."""

    @classmethod
    def of_stage(cls, stage: Stage) -> StepLimits:
        """The loaded stage's limits, checked; ``ValueError`` naming a wrong one."""
        inputs = stage.max_inputs_per_step
        ends = getattr(stage, "ends_without_input", False)
        if not isinstance(ends, bool):
            raise ValueError(f"ends_without_input must be a bool, not {ends!r}")
        payloads, visible = stage.max_payloads_per_step, stage.max_visible_per_step
        if inputs is not None and (not isinstance(inputs, int) or inputs < 1):
            raise ValueError(f"max_inputs_per_step must be None or at least 1, not {inputs!r}")
        for label, value in (
            ("max_payloads_per_step", payloads),
            ("max_visible_per_step", visible),
        ):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{label} must be an int of at least 0, not {value!r}")
        return cls(payloads, visible, inputs, ends)

    @classmethod
    def of_attributes(cls, stage_class: object) -> StepLimits | None:
        """The limits a stage class declares as int class attributes, else None."""
        payloads = getattr(stage_class, "max_payloads_per_step", None)
        visible = getattr(stage_class, "max_visible_per_step", None)
        if type(payloads) is int and type(visible) is int:
            return cls(payloads, visible)
        return None


@dataclass(frozen=True, slots=True)
class StageDeclarations:
    """What a stage class declares about itself, read before it loads, here only.

    Every declaration is an optional class attribute of the stage class, of this type:

    - ``checkpoint: str``: the model family whose one checkpoint folder the stage reads
      its part of (``checkpoint = "qwen3-omni"``), so ``--model-path DIR`` gives every
      such stage ``DIR``; without it, a stage's ``model_path`` is its own model.
    - ``tasks: tuple[str, ...]``: what else the server may ask of it
      (``("transcribe",)``: /v1/audio/transcriptions and input audio transcription).
    - ``voices: tuple[str, ...]``: the voices it speaks in (the first is its default).
    - per-step limits: ``max_payloads_per_step`` and ``max_visible_per_step`` as ints,
      or a classmethod ``step_limits(params) -> StepLimits | None`` (see ``Stage``).
    - what one step costs and yields: a classmethod ``step_cost(params) -> StepCost |
      None`` (``omnitrio/admission/_prior.py``), headroom's prior for a first wave.

    and one optional method of the loaded stage: ``stage_statistics() -> Mapping[str,
    float]``, its own figures beside the runtime's (cheap: it is called from trio).
    A declaration of the wrong type is refused when the config is parsed, naming it.
    """

    checkpoint: str | None = None
    tasks: tuple[str, ...] = ()
    voices: tuple[str, ...] = ()

    @classmethod
    def of(cls, stage_class: object) -> StageDeclarations:
        """The declarations of ``stage_class``; ``TypeError`` naming a wrong one."""
        name = str(getattr(stage_class, "__qualname__", stage_class))
        checkpoint = getattr(stage_class, "checkpoint", None)
        if checkpoint is not None and not isinstance(checkpoint, str):
            raise TypeError(f"{name}.checkpoint must be a str, not {checkpoint!r}")
        return cls(
            checkpoint, _names(stage_class, "tasks", name), _names(stage_class, "voices", name)
        )


def _names(stage_class: object, attribute: str, name: str) -> tuple[str, ...]:
    value = getattr(stage_class, attribute, ())
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name}.{attribute} must be a tuple of str, not {value!r}")
    return value


@runtime_checkable
class Stage(Protocol):
    """A synchronous, batched model stage. See the module docstring for the call order.

    ``max_payloads_per_step`` and ``max_visible_per_step`` bound what one step
    may emit for one stream; the scheduler only picks a stream when its channels
    have that much room, so a step can always hand its output on without waiting.
    ``max_inputs_per_step`` bounds what one step takes from the incoming edge
    (``None``: everything waiting); the rest stays in the bounded channel, which
    is what holds the upstream stage back.

    The config's capacities are checked against these limits when the config is
    parsed if the stage class declares them: as class attributes (ints), or, when they
    follow the stage's parameters, with a classmethod ``step_limits(params) ->
    StepLimits | None`` (``params``: the config's, the constructor's defaults filled
    in; None: not known before it loads). Otherwise they are checked as the stage
    loads. Either way, the loaded stage's own attributes are what the scheduler
    reserves by. What else a stage class may declare (its checkpoint, tasks, voices,
    statistics), and their types: ``StageDeclarations``. A loaded stage may also say
    ``ends_without_input = True``: a stream whose input ends with no item has no output
    here (a TTS stage's for a transcription), so it is ended on trio without a step.
    """

    max_inputs_per_step: int | None
    max_payloads_per_step: int
    max_visible_per_step: int

    def open_stream(self, stream_id: str, request: Request) -> None: ...

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]: ...

    def close_stream(self, stream_id: str) -> None: ...

    def close(self) -> None: ...
