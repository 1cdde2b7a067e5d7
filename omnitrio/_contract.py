"""Checking what a stage hands back, on the stage's own worker thread.

A stage's promises (``max_*_per_step``) are read once, when it loads, into
``StepLimits``; the scheduler reserves credit by them. ``check_output`` holds each
step's per-stream output to them and to the shape of ``StreamOutput``: a
violation becomes that stream's error (``ProtocolError``), never a crash of the
pipeline and never a payload on a client's channel.
"""

from __future__ import annotations

from ._items import VISIBLE_TYPES
from ._stage import StepLimits, StreamOutput


class ProtocolError(RuntimeError):
    """A stage broke the stage protocol (the stage's bug, reported on its stream)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"stage broke the protocol: {problem}")

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str]]:
        # Made in a Ray-placed stage's process too: it pickles by its problem.
        return (ProtocolError, (self.problem,))


def check_output(output: object, limits: StepLimits, *, feeds_edge: bool) -> StreamOutput:
    """``output`` if it keeps the protocol (``feeds_edge``: the stage has an outgoing
    edge, so it may send payloads), else a ``StreamOutput`` carrying the error."""
    problem = _problem(output, limits, feeds_edge)
    if problem is not None:
        return StreamOutput(error=ProtocolError(problem))
    assert isinstance(output, StreamOutput)
    return output


def _problem(output: object, limits: StepLimits, feeds_edge: bool) -> str | None:
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
    if output.payloads and not feeds_edge:
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
