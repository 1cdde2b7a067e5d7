"""Admission that waits instead of refusing (``pipeline.admission_wait_s``).

The rules (``_rule.py``) answer *now*: a stream is admitted or refused with a retry
hint. Where the hint is short (the startup guard's: until a playing stream has its next
phrase ahead; ``max_streams``: until a stream ends), refusing turns a delay of a few
hundred milliseconds into an error the client must retry. So a request the rule turns
away waits instead, while all of these hold:

- **bounded in time**: it waits at most ``max_wait_s`` from its arrival, and only while
  the hint (when there is one) falls within what is left of that; then it is refused
  with the rule's hint of that moment;
- **bounded in number**: at most ``max_waiting`` requests wait; a newcomer beyond them
  is refused at once (unless it passes the head, below: that takes no place);
- **first in, first out**: only the request at the head of the queue asks the rule
  again, and a newcomer queues behind the waiting ones rather than going before them,
  so no request waits behind later ones; with one exception:
- **a quiet request passes a head held for its audio**: a request that plays no audio
  (a transcription, a text chat: ``audio`` False) behind a head that plays audio and is
  held only by a guard that holds audio streams alone (``unheld``: the rule would admit
  the head but for it; ``admission: cpu``'s startup hold) asks the rule at once, and is
  admitted where the rule admits it, rather than waiting for a startup it has no part
  in. Requests that play audio never pass one another, and a head is passed at most
  ``max_passes`` times (``pipeline.admission_max_passes``, default ``MAX_PASSES``; then
  the queue is first in, first out again until it leaves),
  so a stream of transcriptions cannot hold a held answer back beyond that;
- **woken, never polled**: the head asks again when the pipeline tells the queue that
  something that moves the rule happened (``wake``: a stage applied a round, which is
  where audio is made and the CPU sampled; a stream ended or was released), or at its
  hint;
- **cancellation-safe**: a request whose caller goes away (its task cancelled) leaves
  the queue at once, and the next one becomes the head.

``AdmissionQueue.statistics`` says how many waited and how long, by how the wait
ended (``AdmissionWaitStatistics``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal, TypeVar

import trio

from .._errors import Overloaded
from .._statistics import AdmissionWaitStatistics

T = TypeVar("T")
_Outcome = Literal["admitted", "refused", "left"]
MAX_PASSES = 4
"""How many quiet requests may pass one held head that plays audio, by default
(``pipeline.admission_max_passes``)."""


class _Waiter:
    __slots__ = ("audio", "num_passed", "refusal", "unheld", "wake")

    def __init__(
        self,
        audio: bool,
        refusal: Callable[[], Overloaded | None],
        unheld: Callable[[], Overloaded | None] | None,
    ) -> None:
        self.wake = trio.Event()
        self.audio = audio
        self.refusal = refusal
        self.unheld = unheld
        self.num_passed = 0


class AdmissionQueue:
    """The requests waiting to be admitted (trio thread only). ``max_wait_s`` 0: none
    waits, every refusal is at once (the rule's answer as it is). ``max_passes``: how
    many quiet requests may pass one held head (see the module)."""

    def __init__(
        self, max_wait_s: float, max_waiting: int, max_streams: int, max_passes: int = MAX_PASSES
    ) -> None:
        self.max_wait_s = max_wait_s
        self.max_waiting = max_waiting
        self.max_streams = max_streams
        self.max_passes = max_passes
        self.closed = False
        self._ended = {"admitted": 0, "refused": 0, "left": 0}
        self._wait_s = 0.0
        self._longest_s = 0.0
        self._waiters: deque[_Waiter] = deque()

    def statistics(self) -> AdmissionWaitStatistics:
        """How many wait now, and how many waited, by how the wait ended, how long."""
        ended = self._ended
        return AdmissionWaitStatistics(
            num_waiting=len(self._waiters),
            num_admitted=ended["admitted"],
            num_refused=ended["refused"],
            num_left=ended["left"],
            wait_s=self._wait_s,
            longest_s=self._longest_s,
        )

    def waits_for(self, refusal: Overloaded, left_s: float | None = None) -> bool:
        """Whether a request turned away with ``refusal`` may wait for it, with ``left_s``
        of its wait left (None: a newcomer's whole ``max_wait_s``): its hint, if it has
        one, comes within that."""
        left_s = self.max_wait_s if left_s is None else left_s
        hint_s = refusal.retry_after_s
        return left_s > 0 and (hint_s is None or hint_s <= left_s)

    def refuses(self, refusal: Overloaded | None, audio: bool = True) -> bool:
        """Whether a newcomer is refused at once, the rule answering ``refusal`` now
        (``Pipeline.refuses``; ``audio``: whether it plays audio): it neither is admitted
        nor may wait. One that plays no audio, which the rule admits and which may pass
        the head, is admitted at once however many wait: it takes no place in the queue."""
        if self._waiters:  # it would queue behind them, unless it passes the head
            if refusal is None and not audio and self._passes(None) is not None:
                return False
            return len(self._waiters) >= self.max_waiting
        return refusal is not None and not self.waits_for(refusal)

    def wake(self) -> None:
        """Something that moves the rule happened: the head asks again, and so do the
        quiet requests behind a head that plays audio and may still be passed."""
        if not self._waiters:
            return
        head = self._waiters[0]
        head.wake.set()
        if head.audio and head.unheld is not None and head.num_passed < self.max_passes:
            for waiter in self._waiters:
                if not waiter.audio:
                    waiter.wake.set()

    def _passes(self, waiter: _Waiter | None) -> _Waiter | None:
        """The head that ``waiter`` (None: a newcomer that plays no audio) may pass now,
        or None. It may when it plays no audio and the head plays audio, has been passed
        fewer than ``max_passes`` times, and is refused now but would be admitted but for
        a guard that holds audio streams alone: a head the rule admits now is never
        passed, so a quiet request woken beside it never takes its room."""
        head = self._waiters[0]
        if head is waiter or (waiter is not None and waiter.audio):
            return None
        if not head.audio or head.unheld is None or head.num_passed >= self.max_passes:
            return None
        held = head.unheld() is None and head.refusal() is not None
        return head if held else None

    def close(self) -> None:
        """The pipeline is closing: every waiter asks again (and is told so)."""
        self.closed = True
        for waiter in self._waiters:
            waiter.wake.set()

    async def admit(
        self,
        attempt: Callable[[], T],
        refusal: Callable[[], Overloaded | None],
        *,
        audio: bool = True,
        unheld: Callable[[], Overloaded | None] | None = None,
    ) -> T:
        """``attempt()``'s stream, asked at once where nobody waits, else (or if it
        raises ``Overloaded`` that may wait) once this request is the head of the queue
        and something moved; raises the last ``Overloaded`` when the wait runs out, or
        one saying the queue is full. ``refusal()``: the rule's answer now, counting
        nothing (the hint for a newcomer refused because the queue is full).
        ``audio``: whether the request plays audio (one that plays none may pass a head
        held for its audio, see the module); ``unheld()``: the rule's answer for it but
        for the guards that hold only streams that play audio (None: it has none)."""
        if not self._waiters:
            try:
                return attempt()
            except Overloaded as exc:
                if not self.waits_for(exc):
                    raise
                last: Overloaded = exc
        else:
            head = None if audio else self._passes(None)
            if head is not None:  # asked before the queue's bound: passing takes no place
                try:
                    stream = attempt()
                except Overloaded:
                    pass
                else:
                    head.num_passed += 1
                    return stream
            if len(self._waiters) >= self.max_waiting:
                raise refusal() or self.full_refusal()
            last = refusal() or self.full_refusal()
        return await self._wait(attempt, last, _Waiter(audio, refusal, unheld))

    async def _wait(self, attempt: Callable[[], T], last: Overloaded, waiter: _Waiter) -> T:
        self._waiters.append(waiter)
        started_s = trio.current_time()
        deadline_s = started_s + self.max_wait_s
        outcome: _Outcome = "refused"  # unless admitted, or cancelled (the caller left)
        try:
            while True:
                hint_s = last.retry_after_s
                recheck_s = deadline_s
                if hint_s is not None:
                    recheck_s = min(deadline_s, trio.current_time() + hint_s)
                with trio.move_on_at(recheck_s):
                    await waiter.wake.wait()
                waiter.wake = trio.Event()
                now_s = trio.current_time()
                passes: _Waiter | None = None
                if self._waiters[0] is not waiter and now_s < deadline_s and not self.closed:
                    passes = self._passes(waiter)
                    if passes is None:
                        continue  # not the head yet: only the head asks
                try:
                    stream = attempt()
                except Overloaded as exc:
                    left_s = deadline_s - now_s
                    if passes is None and not self.waits_for(exc, left_s):
                        raise
                    last = exc if passes is None else last
                    continue
                if passes is not None:
                    passes.num_passed += 1
                outcome = "admitted"
                return stream
        except trio.Cancelled:
            outcome = "left"
            raise
        finally:
            self._leave(waiter, trio.current_time() - started_s, outcome)

    def _leave(self, waiter: _Waiter, waited_s: float, outcome: _Outcome) -> None:
        was_head = self._waiters[0] is waiter
        self._waiters.remove(waiter)
        self._ended[outcome] += 1
        self._wait_s += waited_s
        self._longest_s = max(self._longest_s, waited_s)
        if was_head:
            self.wake()  # the next one asks at once: what let this one in may fit it too

    def full_refusal(self) -> Overloaded:
        """The refusal of a newcomer that the rule admits but that would wait behind
        ``max_waiting`` requests already waiting."""
        return Overloaded(
            self.max_streams,
            None,
            f"{len(self._waiters)} requests are waiting to be admitted "
            "(pipeline.admission_max_waiting)",
        )
