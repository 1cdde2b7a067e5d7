"""The cores go to an answer's first audio: later LLM tokens wait while it is synthesised.

On a machine with few cores, an answer's first phrase is synthesised (tts.py) while
CTranslate2 decodes the rest of that answer on two threads beside it: measured on 2
vCPUs, the first phrase's first part took 150-250 ms in the server against ~85 ms
alone (docs/benchmarks-voice.md, issue 24). That synthesis is on the path to the first
audio the user hears; the tokens after the first phrase are not (the first phrase's
audio lasts seconds). So while any answer's first phrase is being synthesised, a
CTranslate2 answer whose own first phrase is already out holds its next token (its
token callback waits here, CTranslate2's threads sleep), and the synthesis has the
cores. Answers still writing their first phrase never wait.

The TTS stage marks the streams whose first phrase is out and the synthesis; the LLM
stage (param ``first_audio_first``) holds. Both must run in one process (the local
runner's stage threads); where they do not, nothing waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MAX_HOLD_S = 0.5  # a hold never lasts longer than this, whatever the synthesis does


class FirstAudio:
    """Which streams' first phrases are out, and whether one is being synthesised."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._synthesizing = 0
        self._past_first: set[str] = set()
        self.max_hold_s = MAX_HOLD_S
        self.held_s = 0.0  # time answers spent holding, in all

    def first_phrase_out(self, stream_id: str) -> None:
        """The stream's first phrase is being spoken: its later tokens may wait."""
        with self._changed:
            self._past_first.add(stream_id)

    def speaking(self, stream_id: str) -> bool:
        """Whether the stream's first phrase is out."""
        with self._changed:
            return stream_id in self._past_first

    def forget(self, stream_id: str) -> None:
        with self._changed:
            self._past_first.discard(stream_id)

    @contextmanager
    def synthesizing(self) -> Iterator[None]:
        """Around the synthesis of (a part of) an answer's first phrase."""
        with self._changed:
            self._synthesizing += 1
        try:
            yield
        finally:
            with self._changed:
                self._synthesizing -= 1
                if not self._synthesizing:
                    self._changed.notify_all()

    def hold(self, stream_id: str) -> None:
        """Wait while a first phrase is being synthesised, if ``stream_id``'s own first
        phrase is out (at most ``max_hold_s``)."""
        with self._changed:
            if not self._synthesizing or stream_id not in self._past_first:
                return
            started = time.perf_counter()
            self._changed.wait_for(lambda: not self._synthesizing, timeout=self.max_hold_s)
            self.held_s += time.perf_counter() - started


FIRST_AUDIO = FirstAudio()  # the process's: the TTS and the LLM stage threads share it
