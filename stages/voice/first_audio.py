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

With ``hold_for_starting`` (the LLM stage's param ``first_audio_from_asr``) the hold
starts earlier: while any other answer is on its way to its first audio at all (from
its ASR step, through its LLM's first phrase, to its first audio made; at most
``STARTING_MAX_S`` after its ASR started, so an answer dropped on the way never holds
the others for long). At several conversations on 2 cores the answers already
speaking otherwise decode their later tokens beside a new answer's transcript,
prefill and first phrase, which are all on that answer's path to its first audio.

With ``own`` (the TTS stage's param ``first_part_pauses_answer``), the answer whose
first part (its first words, before its first phrase is complete) is being
synthesised holds its own next token meanwhile: that synthesis is its first audio, and
on 2 cores its own decoding beside it (two CTranslate2 threads) slowed it by ~60 ms.
Its later words wait that long; the join across to its whole first phrase still has
the first part's audio (~0.4 s) to be made in (tts.py counts and logs late joins).

With ``through_first_phrase`` (the LLM stage's param ``first_audio_through_first_phrase``;
needs ``hold_for_starting``), an answer counts as starting on past its first audio until
its first phrase is whole (the TTS made it: its join, or the phrase spoken whole; at
most ``THROUGH_MAX_S`` after its ASR started). Traced at four conversations on 2 cores
(issue 41, eighth session's runs), 13 of the 18 later parts late for a 200 ms buffer in
16 runs were an answer's second or third part (mostly its first phrase's join): its first
~0.3-0.6 s of audio ran out while the LLM, beside the answers already speaking, was still
writing the phrase's last words (no hold on the way: tokens 40-70 ms apart).

With ``min_slack_s`` (the LLM stage's param ``first_audio_min_slack_s``; None: off),
an answer holds only while it can afford to: while the audio it has made runs out more
than ``min_slack_s`` from now (the TTS stage tells when, ``audio_made``), and never once
it is that close to running dry. A hold that has to end for that ends then. At four
conversations on 2 cores the blunt holds kept the answers already speaking from writing
their next phrase in time: of the audio that came more than a 200 ms buffer late, the
LLM's text was the larger part (24 of 43 s, the TTS's queue 12, synthesis 6;
docs/benchmarks-voice.md, issue 41).

The TTS stage marks the streams whose first phrase is out, the synthesis, the first
audio and when each answer's audio made so far runs out; the ASR stage marks an answer
starting; the LLM stage (param ``first_audio_first``) holds. All must run in one
process (the local runner's stage threads); where they do not, nothing waits.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import trace
from .payloads import TextPiece

MAX_HOLD_S = 0.5  # a hold never lasts longer than this, whatever the synthesis does
STARTING_MAX_S = 1.5  # an answer counts as starting at most this long after its ASR
THROUGH_MAX_S = 2.5  # ... with through_first_phrase, until its first phrase is whole
TRANSIT_MAX_S = 0.1  # text handed on this long ago and not at the TTS is not coming (dropped)
TRANSIT_WAIT_S = 0.001  # a held TTS step that finds text on its way waits this, then returns
HELD_WAIT_MAX_S = 0.1  # ... and waits at most this in one step (the runtime's closes run between)
HANDED_KEEP_S = 5.0  # an answer's last text handed on this long ago is forgotten (its streams gone)


class FirstAudio:
    """Which streams' first phrases are out, and whether one is being synthesised."""

    def __init__(self) -> None:
        lock = threading.RLock()
        self._changed = threading.Condition(lock)  # wakes the holds in the LLM's token callbacks
        self._tts_woken = threading.Condition(lock)  # ... and the TTS's held step (wait_held)
        self._synthesizing = 0
        self._past_first: set[str] = set()
        self._own_paused: set[str] = set()  # answers whose own first part is synthesised
        self._starting: dict[str, float] = {}  # answers before their first audio: started at
        self._runs_out: dict[str, float] = {}  # when each answer's audio made so far runs out
        self._handed: dict[str, tuple[float, bool]] = {}  # the LLM's last text out: stamp, end
        self._handed_at: dict[str, float] = {}  # ... when
        self._fed: dict[str, tuple[float, bool]] = {}  # ... the last the TTS had
        self.min_slack_s: float | None = None  # hold only with more audio ahead than this
        self.max_hold_s = MAX_HOLD_S
        self.hold_for_starting = False
        self.through_first_phrase = False  # an answer starts until its first phrase is whole
        self.held_s = 0.0  # time answers spent holding, in all
        self.held_wait_max_s = HELD_WAIT_MAX_S

    def answer_starting(self, stream_id: str) -> None:
        """An answer is on its way to its first audio (its ASR step begins)."""
        with self._changed:
            self._starting[stream_id] = time.monotonic()

    def first_audio_made(self, stream_id: str) -> None:
        """The stream's first audio is out: it no longer holds the others (with
        ``through_first_phrase``, once its first phrase is whole)."""
        if not self.through_first_phrase:
            self._started(stream_id)

    def first_phrase_made(self, stream_id: str) -> None:
        """The stream's first phrase is whole (its join, or the phrase spoken whole):
        with ``through_first_phrase``, it no longer holds the others."""
        if self.through_first_phrase:
            self._started(stream_id)

    def _started(self, stream_id: str) -> None:
        with self._changed:
            if self._starting.pop(stream_id, None) is not None:
                self._changed.notify_all()
                self._tts_woken.notify_all()

    def audio_made(self, stream_id: str, runs_out: float) -> None:
        """The stream's audio made so far runs out at ``runs_out`` (``time.monotonic``),
        if it plays from its first audio on in real time."""
        with self._changed:
            self._runs_out[stream_id] = runs_out

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
            self._own_paused.discard(stream_id)
            self._runs_out.pop(stream_id, None)
            for seen in (self._handed, self._handed_at, self._fed):
                seen.pop(stream_id, None)
            if self._starting.pop(stream_id, None) is not None:
                self._changed.notify_all()
                self._tts_woken.notify_all()

    @contextmanager
    def synthesizing(self, own: str | None = None) -> Iterator[None]:
        """Around the synthesis of (a part of) an answer's first phrase; with ``own``
        (that answer's stream id), its own next token waits too, its first phrase out
        or not."""
        with self._changed:
            self._synthesizing += 1
            if own is not None:
                self._own_paused.add(own)
        try:
            yield
        finally:
            with self._changed:
                self._synthesizing -= 1
                self._own_paused.discard(own or "")
                self._changed.notify_all()

    def hold(self, stream_id: str) -> None:
        """Wait while a first phrase is being synthesised (or, with
        ``hold_for_starting``, while another answer is starting), if ``stream_id``'s own
        first phrase is out and (with ``min_slack_s``) its audio ahead affords it, or
        while its own first part is (at most ``max_hold_s``)."""
        with self._changed:
            if not self._waits(stream_id):
                return
            started = time.perf_counter()
            since, why = time.monotonic(), self._why(stream_id) if trace.ENABLED else ""
            deadline = started + self.max_hold_s
            while self._waits(stream_id) and (left := deadline - time.perf_counter()) > 0:
                # Woken when a synthesis or a start ends, or when its slack is spent.
                self._changed.wait(min(left, self._affordable_s(stream_id)))
            self.held_s += time.perf_counter() - started
            trace.held(stream_id, since, why)

    def _why(self, stream_id: str) -> str:
        """What ``stream_id`` holds for, for the trace (the lock held)."""
        if stream_id in self._own_paused:
            return "own"
        starting = ",".join(sid for sid in self._starting if sid != stream_id)
        return f"synth={self._synthesizing};starting={starting or '-'}"

    def _waits(self, stream_id: str) -> bool:
        """Whether ``stream_id``'s next token waits now (the lock held)."""
        if stream_id in self._own_paused:
            return True
        if stream_id not in self._past_first or not self._busy(stream_id):
            return False
        return self._affordable_s(stream_id) > 0

    def _affordable_s(self, stream_id: str) -> float:
        """How much longer ``stream_id`` may hold before its audio ahead is down to
        ``min_slack_s`` (inf: no limit; the lock held). An answer with no audio made
        yet affords none."""
        if self.min_slack_s is None:
            return math.inf
        runs_out = self._runs_out.get(stream_id)
        if runs_out is None:
            return 0.0
        return runs_out - self.min_slack_s - time.monotonic()

    def later_may_wait(self, stream_id: str, min_slack_s: float) -> bool:
        """Whether ``stream_id``'s later phrase may wait at the TTS now (its param
        ``later_phrase_min_slack_s``): its first phrase is out, another answer is on its
        way to its first audio (as ``hold_for_starting`` counts it, whatever that is
        set to), and its own audio made runs out more than ``min_slack_s`` from now."""
        with self._changed:
            runs_out = self._runs_out.get(stream_id)
            if stream_id not in self._past_first or runs_out is None:
                return False
            if runs_out - time.monotonic() <= min_slack_s:
                return False
            return self._another_starting(stream_id)

    def handed(self, stream_id: str, payloads: tuple[object, ...], done: bool) -> None:
        """The LLM stage handed the TTS the answer's text ``payloads`` (or its end:
        ``done``): a TTS step that waits (``wait_held``) returns to take it. Answers
        handed nothing for ``HANDED_KEEP_S`` are forgotten here (a stream whose TTS never
        opened or closed first, or no TTS in the process, would keep them for ever)."""
        with self._changed:
            now = time.monotonic()
            for sid, at in list(self._handed_at.items()):
                if now - at > HANDED_KEEP_S:
                    del self._handed[sid], self._handed_at[sid]
            self._handed[stream_id] = _stamp(self._handed.get(stream_id), payloads, done)
            self._handed_at[stream_id] = now
            self._tts_woken.notify_all()  # not the holds: a token's text is no news to them

    def fed(self, stream_id: str, inputs: tuple[object, ...], closed: bool) -> None:
        """The TTS stage has the answer's text ``inputs`` (and its end: ``closed``)."""
        with self._changed:
            self._fed[stream_id] = _stamp(self._fed.get(stream_id), inputs, closed)

    def wait_held(self, until: float, slack_s: float) -> bool:
        """The TTS's step whose only work is later phrases that wait
        (``later_may_wait`` with ``slack_s``): wait until ``until`` (``time.monotonic``:
        the soonest of them may go), the answers' starts end, or text the LLM handed on
        is on its way to the TTS for an answer that would not wait (one starting, or
        with at most ``slack_s`` of audio ahead, in this step's batch or not), whichever
        is first, and at most ``held_wait_max_s``. Whether the step returns with its
        phrase still held (text on its way: the next step takes it; or the wait's cap:
        the runtime's round, its closes, run between); else a held phrase may go now.
        Woken by the event, not polled: a held phrase goes at once, and the TTS never
        sleeps while text waits."""
        with self._tts_woken:
            capped = time.monotonic() + self.held_wait_max_s
            while True:
                now = time.monotonic()
                if self._in_transit(now, slack_s):
                    self._tts_woken.wait(TRANSIT_WAIT_S)  # the runtime's delivery: a moment
                    return True
                left = min(until, self._starts_end(now), *self._runs_low(slack_s)) - now
                if left <= 0:
                    return False
                if now >= capped:
                    return True
                self._tts_woken.wait(min(left, capped - now))

    def _pending(self) -> Iterator[str]:
        """The answers past their first phrase whose text handed on is not at the TTS
        yet (the lock held)."""
        fed = self._fed
        for sid, stamp in self._handed.items():
            if sid in self._past_first and stamp != fed.get(sid):
                yield sid

    def _runs_low(self, slack_s: float) -> list[float]:
        """When each answer of ``_pending`` is down to ``slack_s`` of audio ahead (the
        lock held): its text is then on its way for an answer that would not wait."""
        return [self._runs_out.get(sid, 0.0) - slack_s for sid in self._pending()]

    def _in_transit(self, now: float, slack_s: float) -> bool:
        """Whether text (or an end) the LLM handed on is not at the TTS yet for an
        answer that would not wait with ``slack_s`` (the lock held). One past its first
        phrase counts once its audio ahead is down to ``slack_s``, however long ago its
        text was handed (in this step's batch or not: its own phrase must not sit while
        it runs dry; ``forget`` drops it once its stream ends), and wakes nobody before
        (its phrase waits anyway: no empty round per token). One starting counts for
        ``TRANSIT_MAX_S`` (then it is taken as not coming: a stream dropped)."""
        if any(t - now <= 0 for t in self._runs_low(slack_s)):
            return True
        fed = self._fed
        return any(
            sid not in self._past_first
            and stamp != fed.get(sid)
            and now - self._handed_at[sid] < TRANSIT_MAX_S
            for sid, stamp in self._handed.items()
        )

    def _starts_end(self, now: float) -> float:
        """When the answers now starting stop counting as starting, at the latest
        (``time.monotonic``; the lock held): ``now`` if none is."""
        if not self._another_starting(""):
            return now
        max_s = THROUGH_MAX_S if self.through_first_phrase else STARTING_MAX_S
        return min(self._starting.values()) + max_s

    def _busy(self, stream_id: str) -> bool:
        """Whether some other answer's first audio is under way (the lock held)."""
        if self._synthesizing:
            return True
        return self.hold_for_starting and self._another_starting(stream_id)

    def _another_starting(self, stream_id: str) -> bool:
        """Whether an answer other than ``stream_id`` is on its way to its first audio
        (the lock held); those past ``STARTING_MAX_S`` (``THROUGH_MAX_S``) are dropped."""
        oldest = time.monotonic() - (THROUGH_MAX_S if self.through_first_phrase else STARTING_MAX_S)
        for sid, since in list(self._starting.items()):
            if since < oldest:
                del self._starting[sid]  # dropped on the way, or its TTS never saw it
        return any(sid != stream_id for sid in self._starting)


def _stamp(
    last: tuple[float, bool] | None, pieces: tuple[object, ...], end: bool
) -> tuple[float, bool]:
    """An answer's text so far, as the stamp of its last piece and whether it ended."""
    stamp, ended = last or (0.0, False)
    for piece in pieces:
        if isinstance(piece, TextPiece):
            stamp = piece.written_s
    return stamp, ended or end


FIRST_AUDIO = FirstAudio()  # the process's: the TTS and the LLM stage threads share it
