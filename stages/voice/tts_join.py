"""An answer's first phrase spoken before it is complete, across a join (the TTS
param ``first_part_words``).

Once the first phrase's first K words are known, a front pass over them alone gives
their alignment, and their audio up to where the last of them begins goes out (so the
fall and lengthening the voice gives a phrase's last word is never heard); when the
phrase is complete, a pass over the whole of it goes on from where that word begins in
its own alignment, its first ``JOIN_FRAMES`` crossfaded over the first pass's frames
just after the part (made with the part, never sent). A part longer than the first
chunk (``first_chunk_frames``) goes out in two steps itself, as a whole phrase would.

A join made after the first part's audio would have played (had the client played it
at once) is counted and logged (``late_joins``): the listener hears a pause there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from .pcm import Floats
from .tts_stream import (
    JOIN_FRAMES,
    SplitPhrase,
    SplitVoice,
    crossfade,
    part_frames,
    word_starts,
    words_of,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Join:
    """What the first part spoke: its words' phoneme ids, and its audio of the frames
    just after them (unsent; the whole phrase's pass fades in over it)."""

    words: tuple[tuple[int, ...], ...]
    tail: Floats


@dataclass
class SplitState:
    """A stream's first phrase between its parts."""

    rest: SplitPhrase | None = None  # a phrase whose first part is out
    rest_end: int = 0  # ... and the frame where its speech stops
    join: Join | None = None  # the first part is out: where the whole phrase goes on
    part_plays_until: float = 0.0  # when the first part's audio has played (perf_counter)


class FirstPhraseJoin:
    """Speaks first parts and the whole phrases they join; counts the joins."""

    def __init__(self, split: SplitVoice, space_id: int, first_chunk_frames: int) -> None:
        self.split = split
        self.space_id = space_id
        self.first_chunk_frames = first_chunk_frames
        self.num_joins = 0  # first phrases spoken across a join
        self.join_mismatches = 0  # ... whose parts' words were phonemised differently
        self.late_joins = 0  # ... whose rest was made after the first part would have played

    def first_words(self, state: SplitState, ids: np.ndarray, phrase: SplitPhrase) -> Floats:
        """The first part (``ids``: its words' phoneme ids, [1, N]; ``phrase``: their
        front pass): its audio up to where the last of its words begins; none if it is
        one word as phonemised (then ``state.join`` stays None and the phrase is spoken
        whole)."""
        symbols = ids[0].tolist()
        starts = word_starts(symbols, phrase.durations, self.space_id)
        words = words_of(symbols, self.space_id)
        if len(starts) < 2:
            return np.zeros(0, np.float32)
        end = starts[-1]  # where the last word begins (with the space before it)
        state.join = Join(tuple(words[:-1]), np.zeros(0, np.float32))
        state.rest_end = min(phrase.num_frames, end + JOIN_FRAMES)
        if state.rest_end > self.first_chunk_frames + self.split.right_frames:
            state.rest = phrase  # the first part itself in two steps, as a whole phrase
            first = self.split.speak(phrase, self.first_chunk_frames)
            state.part_plays_until = time.perf_counter() + first.size / self.split.sample_rate_hz
            return first
        return self.keep_tail(state, phrase, self.split.speak(phrase, state.rest_end))

    def keep_tail(self, state: SplitState, phrase: SplitPhrase, samples: Floats) -> Floats:
        """Out: ``samples`` but their last frames, which the join fades out."""
        assert state.join is not None
        keep = (phrase.next_frame - (state.rest_end - JOIN_FRAMES)) * self.split.hop
        keep = max(0, min(keep, samples.size))
        state.join = Join(state.join.words, samples[samples.size - keep :])
        out = samples[: samples.size - keep]
        start = state.part_plays_until or time.perf_counter()  # (its first chunk's, if any)
        state.part_plays_until = start + out.size / self.split.sample_rate_hz
        return out

    def after_join(
        self, state: SplitState, ids: np.ndarray, scales: Floats, max_part_frames: int | None
    ) -> tuple[Floats, SplitPhrase]:
        """The whole first phrase (``ids``), from where the first part's last word begins:
        its audio (at most its first ``max_part_frames`` frames from there, None: all)
        and the phrase, whose further frames go on from ``next_frame``."""
        assert state.join is not None
        join, state.join = state.join, None
        self.num_joins += 1
        phrase = self.split.front(ids, scales)
        symbols = ids[0].tolist()
        words = words_of(symbols, self.space_id)
        n = len(join.words)
        if tuple(words[:n]) != join.words:
            self.join_mismatches += 1
        starts = word_starts(symbols, phrase.durations, self.space_id)
        phrase.next_frame = starts[min(n, len(starts) - 1)]
        left = phrase.num_frames - phrase.next_frame
        samples = self.split.speak(phrase, part_frames(left, max_part_frames))
        late_s = time.perf_counter() - state.part_plays_until
        if late_s > 0:  # a pause inside the first phrase, if the client played it at once
            self.late_joins += 1
            logger.warning(
                "first phrase's rest made %.0f ms after its first part played", 1e3 * late_s
            )
        return crossfade(join.tail, samples), phrase
