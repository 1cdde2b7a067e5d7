"""What the voice LLM's CPU runtimes share (llm_ct2.py: CTranslate2, llm_llamacpp.py:
llama.cpp): an answer's tokens handed from the runtime's threads to the stage's step.

A runtime generates each answer on threads of its own; each token is put into the
answer's ``arrived`` under the runtime's one condition, which wakes the stage's step
waiting in ``wait_any``; the step ``take``s what has arrived. ``cancelled`` is set by
the stage (the stream closed): the runtime stops that answer at its next token.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class FastAnswer:
    """One answer being generated; a runtime's answer type says when it has failed."""

    arrived: deque[tuple[int, bool]] = field(default_factory=deque, kw_only=True)  # (id, last)
    cancelled: bool = field(default=False, kw_only=True)

    def failed(self) -> bool:
        """Generation ended without its last token (an error: ``check`` raises it)."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise the generation's error, if it failed."""
        raise NotImplementedError


def hand_over(changed: threading.Condition, answer: FastAnswer, token: int, last: bool) -> None:
    """A token of ``answer``, on the runtime's thread (``changed``: the runtime's condition)."""
    with changed:
        answer.arrived.append((token, last))
        changed.notify_all()


class TokenHandover:
    """A runtime's condition (``_changed``), which its threads signal and the stage's
    step waits on."""

    def __init__(self) -> None:
        self._changed = threading.Condition()

    def wait_any(self, answers: Sequence[FastAnswer], timeout_s: float) -> None:
        """Return once one of ``answers`` has tokens waiting (or has failed), or after
        ``timeout_s``."""
        with self._changed:
            self._changed.wait_for(
                lambda: any(a.arrived or a.failed() for a in answers), timeout=timeout_s
            )

    def take(self, answer: FastAnswer) -> list[tuple[int, bool]]:
        """The tokens that have arrived since the last take."""
        with self._changed:
            tokens = list(answer.arrived)
            answer.arrived.clear()
        return tokens
