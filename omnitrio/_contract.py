"""Checking what a stage hands back, on the stage's own worker thread.

A stage's promises (``max_*_per_step``) are read once, when it loads, into
``Limits``; the scheduler reserves credit by them. ``check_output`` holds each
step's per-stream output to them and to the shape of ``StreamOutput``: a
violation becomes that stream's error (``ProtocolError``), never a crash of the
pipeline and never a payload on a client's channel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._items import VISIBLE_TYPES
from ._stage import Stage, StreamOutput


class ProtocolError(RuntimeError):
    """A stage broke the stage protocol (the stage's bug, reported on its stream)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"stage broke the protocol: {problem}")

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str]]:
        # Made in a Ray-placed stage's process too: it pickles by its problem.
        return (ProtocolError, (self.problem,))


@dataclass(frozen=True, slots=True)
class Limits:
    """A stage's per-step promises, read once at load."""

    max_inputs_per_step: int | None
    max_payloads_per_step: int
    max_visible_per_step: int
    has_outbox: bool

    @classmethod
    def of(cls, stage: Stage, *, has_outbox: bool) -> Limits:
        inputs = stage.max_inputs_per_step
        payloads, visible = stage.max_payloads_per_step, stage.max_visible_per_step
        if inputs is not None and (not isinstance(inputs, int) or inputs < 1):
            raise ValueError(f"max_inputs_per_step must be None or at least 1, not {inputs!r}")
        for label, value in (
            ("max_payloads_per_step", payloads),
            ("max_visible_per_step", visible),
        ):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{label} must be an int of at least 0, not {value!r}")
        return cls(inputs, payloads, visible, has_outbox)


def check_output(output: object, limits: Limits) -> StreamOutput:
    """``output`` if it keeps the protocol, else a ``StreamOutput`` carrying the error."""
    problem = _problem(output, limits)
    if problem is not None:
        return StreamOutput(error=ProtocolError(problem))
    assert isinstance(output, StreamOutput)
    return output


def _problem(output: object, limits: Limits) -> str | None:
    if not isinstance(output, StreamOutput):
        return f"step returned a {type(output).__name__} for a stream, not a StreamOutput"
    if output.error is not None and not isinstance(output.error, Exception):
        return f"StreamOutput.error is a {type(output.error).__name__}, not an Exception"
    if not isinstance(output.payloads, tuple) or not isinstance(output.visible, tuple):
        return "StreamOutput.payloads and .visible must be tuples"
    if len(output.payloads) > limits.max_payloads_per_step:
        return (
            f"{len(output.payloads)} payloads in one step, above its "
            f"max_payloads_per_step={limits.max_payloads_per_step}"
        )
    if output.payloads and not limits.has_outbox:
        return "payloads from the last stage, which has no outgoing edge"
    if len(output.visible) > limits.max_visible_per_step:
        return (
            f"{len(output.visible)} visible items in one step, above its "
            f"max_visible_per_step={limits.max_visible_per_step}"
        )
    wrong = [type(v).__name__ for v in output.visible if not isinstance(v, VISIBLE_TYPES)]
    if wrong:
        return f"non-visible {', '.join(wrong)} among visible items (use payloads for edges)"
    return None
