"""Which of the TTS stage's answers speaks what in a step (tts.py): each answer's
phrase queue, and the step's choice of the phrases to synthesise.

The answer's text arrives from the LLM a token at a time (``TextPiece``); each answer
cuts it into phrases (phrases.py) and queues them as they are complete. The streams of
a batch are synthesised one after another (Piper's ONNX graph returns no per-item
lengths, so a padded batch could not be cut back apart), so a step is kept short where
an answer's first audio may be waiting: a step that speaks some answer's first phrase
speaks no other answer's later phrase, and a step with no first phrase speaks one
later phrase, that of the answer whose audio runs out soonest (played from its first
audio on, in real time). Each later phrase takes ~100-300 ms; several in one step held
a first phrase that arrived meanwhile behind all of them.

With the TTS param ``first_phrase_cut_s`` (null: off), a first phrase still open when
its first part's audio runs out within that many seconds ends at its last whole word,
its join made then (the rest of its text opens the next phrase): measured with
``--trace``, the few parts late for a 200 ms buffer at one conversation, and with
``admission: cpu`` at four, all waited on the LLM completing the first phrase, not on
synthesis. With ``later_phrase_cut_s`` (null: off), a later phrase still open when the
answer's audio made so far runs out within that many seconds ends too: before its last
boundary word, else at its last whole word (phrases.py ``cut_later``). Measured with
``--trace`` at one conversation (issue 41, sixth session), the answers that ran dry
for a 200 ms buffer all waited on a later phrase the LLM was still writing: a first
phrase cut for length at a boundary left its words to the second, which then ran on to
its sentence's end through quoted names of many tokens each.

With ``later_phrase_min_slack_s`` (null: off), a later phrase also waits while another
answer is on its way to its first audio or its first phrase's join (first_audio.py
``later_may_wait``), if its own answer's audio runs out more than that many seconds
from now. Traced at four conversations (issue 41, eleventh session), a first phrase's
join whose text came late had waited for the TTS step speaking another answer's later
phrase, most often one with more than 1 s of audio ahead. A phrase held back goes once
its audio ahead is down to the slack, and can then be in a join's way itself
(docs/benchmarks-voice.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .payloads import TextPiece
from .phrases import PhraseSplitter
from .tts_join import SplitState
from .tts_stream import SplitPhrase


@dataclass
class PhraseQueue(SplitState):
    """One answer's phrases: queued, being spoken, and when its audio runs out."""

    splitter: PhraseSplitter = field(default_factory=PhraseSplitter)
    phrases: deque[str] = field(default_factory=deque)
    text_done: bool = False
    spoken: int = 0  # phrases begun
    part: str | None = None  # the first phrase's first words, to speak before it is complete
    runs_out: float = 0.0  # when its audio made so far would have played, from its first audio
    going_on: SplitPhrase | None = None  # a phrase spoken in parts, its first part out
    ready_at: deque[float] = field(default_factory=deque)  # when each queued phrase was complete
    text_ready: float = 0.0  # ... and the phrase being spoken (trace.py)
    written_at: deque[float] = field(default_factory=deque)  # ... its text left the LLM
    text_written: float = 0.0  # ... and the phrase being spoken's
    last_written: float = 0.0  # when the last piece fed left the LLM

    def feed(self, pieces: Sequence[object], input_closed: bool) -> None:
        """Queue the phrases ``pieces`` (the step's inputs) complete; at the end of the
        text (``input_closed``) the rest of it as the last phrase."""
        for piece in pieces:
            if isinstance(piece, TextPiece):
                phrases = self.splitter.feed(piece.text)
                self.phrases.extend(phrases)
                self.ready_at.extend(time.monotonic() for _ in phrases)
                self.last_written = piece.written_s
                self.written_at.extend(piece.written_s for _ in phrases)
                part = self.splitter.first_part()
                if part is not None and not self.phrases:
                    self.part = part  # spoken unless the whole phrase comes first
        if self.phrases and self.spoken == 0:
            self.part = None
        if input_closed and not self.text_done:
            self.text_done = True
            self._queue(self.splitter.flush(), self.last_written)

    def cut_if_late(self, cut_s: float | None) -> bool:
        """With ``cut_s`` (``first_phrase_cut_s``): once the first part's audio runs out
        within it and the first phrase is still open, the phrase ends at its last whole
        word (the rest of its text opens the next phrase), so its join is made in time.
        Whether it was cut."""
        if cut_s is None or self.join is None or self.rest is not None or self.phrases:
            return False
        if self.part_plays_until - time.perf_counter() >= cut_s:
            return False
        return self._queue(self.splitter.cut_first())

    def cut_later_if_late(self, cut_s: float | None) -> bool:
        """With ``cut_s`` (``later_phrase_cut_s``): once the answer's audio made so far
        runs out within it, nothing is queued or going on and a later phrase is open, that
        phrase ends now (phrases.py ``cut_later``), so its audio is made in time. Whether it
        was cut."""
        if cut_s is None or not self.runs_out or self.text_done or self.phrases:
            return False
        if self.join is not None or self.rest is not None or self.going_on is not None:
            return False
        if self.runs_out - time.monotonic() >= cut_s:
            return False
        return self._queue(self.splitter.cut_later())

    def _queue(self, phrase: str | None, written_s: float | None = None) -> bool:
        """Queue ``phrase``, complete now, if there is one; whether there was. Its text
        left the LLM at ``written_s`` (None: it is complete only now, a cut for time)."""
        if phrase is None:
            return False
        now = time.monotonic()
        self.phrases.append(phrase)
        self.ready_at.append(now)
        self.written_at.append(now if written_s is None else written_s)
        return True

    def first_due(self) -> bool:
        """Whether the answer's next audio is (part of) its first phrase."""
        if self.rest is not None or self.part is not None:
            return True
        return (self.spoken == 0 or self.join is not None) and bool(self.phrases)

    def later_due(self) -> bool:
        """Whether the answer's next audio is (part of) a later phrase, ready to speak."""
        ready = bool(self.phrases) or self.going_on is not None
        return ready and not self.first_due()

    def pop(self) -> str:
        """The next phrase, off the queue."""
        self.text_ready = self.ready_at.popleft() if self.ready_at else 0.0
        self.text_written = self.written_at.popleft() if self.written_at else 0.0
        return self.phrases.popleft()


def later_phrase(
    queues: Mapping[str, PhraseQueue],
    batch: Sequence[str],
    may_wait: Callable[[str], bool] | None = None,
) -> tuple[str | None, bool]:
    """The one answer of ``batch`` whose later phrase this step speaks: none while any
    answer's first phrase is due (the others' earlier audio is still playing, so the
    first audio is not held back behind them); else the answer whose audio runs out
    first (the others next), of those ``may_wait`` (the TTS param
    ``later_phrase_min_slack_s``) does not hold back. And whether ``may_wait`` held one
    back."""
    if any(queues[sid].first_due() for sid in batch):
        return None, False
    due = [sid for sid in batch if queues[sid].later_due()]
    waiting = [sid for sid in due if may_wait is None or not may_wait(sid)]
    held = len(waiting) < len(due)
    return (min(waiting, key=lambda sid: queues[sid].runs_out) if waiting else None), held


def held_until(queues: Mapping[str, PhraseQueue], batch: Sequence[str], slack_s: float) -> float:
    """Until when (``time.monotonic``) a TTS step whose only work in ``batch`` is later
    phrases held back (``later_phrase_min_slack_s``: ``slack_s``) may wait: until the
    first of them may go, its answer's audio ahead down to the slack."""
    due = [queues[sid].runs_out for sid in batch if queues[sid].later_due()]
    return min(due, default=time.monotonic() + slack_s) - slack_s
