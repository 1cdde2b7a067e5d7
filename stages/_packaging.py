"""Off the critical path: a stage's packaging thread and its per-step statistics.

An autoregressive step needs only the sampled tokens to start the next step.
Everything else — slicing hidden states for the next stage, detokenizing, building
``StreamOutput`` pieces — is a job handed to a ``Packager``: one thread per stage
fed by a bounded queue (a full queue holds the step back, so memory stays
bounded). Finished pieces wait per stream until that stream's next step collects
them (``step_output``); the step blocks on a stream's pieces only when the stream
has nothing left to compute (its end), so packaging never delays the next forward.
Shared by every autoregressive model stage.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omnitrio import Event, StreamOutput, TextDelta, VisibleItem


@dataclass(frozen=True, slots=True)
class Piece:
    """What one packaging job made for one stream."""

    payloads: tuple[object, ...] = ()
    visible: tuple[VisibleItem, ...] = ()


Job = Callable[[], dict[str, Piece]]


class PackagingError(RuntimeError):
    """A packaging job failed; the streams it was packaging fail with this."""


@dataclass
class _Ledger:
    pending: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ready: dict[str, deque[Piece]] = field(default_factory=lambda: defaultdict(deque))
    dropped: set[str] = field(default_factory=set)
    errors: dict[str, Exception] = field(default_factory=dict)
    packaging_s_total: float = 0.0
    packaging_s_last: float = 0.0
    num_jobs: int = 0


class Packager:
    """A packaging thread for one stage. Every public method is called from the stage's thread."""

    def __init__(self, name: str, *, max_queued_jobs: int) -> None:
        self._jobs: queue.Queue[tuple[tuple[str, ...], Job] | None] = queue.Queue(max_queued_jobs)
        self._changed = threading.Condition()
        self._ledger = _Ledger()
        # Started by the first job, so a stage that fails to load leaves no thread behind.
        self._thread = threading.Thread(target=self._main, name=f"{name}-packaging", daemon=True)

    def submit(self, stream_ids: tuple[str, ...], job: Job) -> None:
        """Queue ``job`` (it makes pieces for ``stream_ids``); blocks while the queue is full."""
        with self._changed:
            for sid in stream_ids:
                self._ledger.pending[sid] += 1
            if self._thread.ident is None:
                self._thread.start()
        self._jobs.put((stream_ids, job))

    def collect(self, stream_id: str, *, wait: bool) -> list[Piece]:
        """The stream's finished pieces in order; with ``wait``, first its pending jobs.

        Raises ``PackagingError`` if a job for this stream failed.
        """
        with self._changed:
            ledger = self._ledger
            if wait:
                self._changed.wait_for(
                    lambda: ledger.pending[stream_id] == 0 or stream_id in ledger.errors
                )
            if stream_id in ledger.errors:
                error = ledger.errors[stream_id]
                raise PackagingError(f"packaging failed: {error}") from error
            return list(ledger.ready.pop(stream_id, deque()))

    def idle(self, stream_id: str) -> bool:
        """No job for the stream is queued or running."""
        with self._changed:
            return self._ledger.pending[stream_id] == 0

    def drop(self, stream_id: str) -> None:
        """The stream is closed: discard its pieces, now and from jobs still queued."""
        with self._changed:
            self._ledger.ready.pop(stream_id, None)
            self._ledger.errors.pop(stream_id, None)
            if self._ledger.pending.get(stream_id):
                self._ledger.dropped.add(stream_id)
            else:
                self._ledger.pending.pop(stream_id, None)

    def times_s(self) -> tuple[float, float, int]:
        """(last job's time, total time, number of jobs)."""
        with self._changed:
            ledger = self._ledger
            return ledger.packaging_s_last, ledger.packaging_s_total, ledger.num_jobs

    def close(self) -> None:
        """Finish queued jobs, then join the thread."""
        if self._thread.ident is not None:
            self._jobs.put(None)
            self._thread.join()

    def _main(self) -> None:
        while (item := self._jobs.get()) is not None:
            stream_ids, job = item
            started = time.perf_counter()
            try:
                pieces = job()
            except Exception as exc:  # the streams' next step fails them with it
                pieces, error = {}, exc
            else:
                error = None
            elapsed_s = time.perf_counter() - started
            with self._changed:
                ledger = self._ledger
                if error is not None:
                    live = [sid for sid in stream_ids if sid not in ledger.dropped]
                    ledger.errors.update(dict.fromkeys(live, error))
                ledger.packaging_s_last = elapsed_s
                ledger.packaging_s_total += elapsed_s
                ledger.num_jobs += 1
                for sid in stream_ids:
                    ledger.pending[sid] -= 1
                    if sid not in ledger.dropped and sid in pieces:
                        ledger.ready[sid].append(pieces[sid])
                    if sid in ledger.dropped and ledger.pending[sid] == 0:
                        ledger.dropped.discard(sid)
                        ledger.pending.pop(sid, None)
                self._changed.notify_all()


class Detokenizer:
    """Streaming detokenization (on the packaging thread): each token's new text."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._sent = ""

    def add(self, token: int | None, *, final: bool) -> str:
        """The text ``token`` adds (None: no token, e.g. a stop token left out)."""
        if token is not None:
            self._tokens.append(token)
        text = str(self._tokenizer.decode(self._tokens, skip_special_tokens=True))
        if text.endswith("\ufffd") and not final:
            return ""  # an incomplete UTF-8 sequence: wait for its next byte
        delta, self._sent = text[len(self._sent) :], text
        return delta


# -- a stream's packaged pieces as the StreamOutput of one step ---------------------------


@dataclass
class Outbox:
    """Pieces collected for one stream but not yet handed on (over a step's limit)."""

    payloads: deque[object] = field(default_factory=deque)


def step_output(
    packager: Packager,
    stream_id: str,
    outbox: Outbox,
    *,
    computing: bool,
    can_continue: bool,
    max_payloads: int,
    wait: bool = False,
) -> StreamOutput:
    """This step's output for one stream.

    ``computing``: the stream still has model work (its last token is not sampled);
    only when it has none does this wait for its packaging, unless ``wait``: then
    it always does, so this step's pieces go out with this step (for a stage whose
    consumer waits on every token, like the voice LLM's TTS, when packaging is
    cheaper than a step's delay). ``can_continue``: the
    stage can step it again without new input. Text pieces merge into one delta,
    events of one name into one event (their tuple fields concatenated).
    """
    texts: list[str] = []
    events: dict[str, dict[str, tuple[object, ...]]] = {}
    try:
        pieces = packager.collect(stream_id, wait=wait or not computing)
    except PackagingError as exc:
        return StreamOutput(error=exc)
    for piece in pieces:
        outbox.payloads.extend(piece.payloads)
        for item in piece.visible:
            if isinstance(item, TextDelta):
                texts.append(item.text)
            elif isinstance(item, Event):
                merged = events.setdefault(item.name, {})
                for key, value in item.data.items():
                    assert isinstance(value, tuple)
                    merged[key] = merged.get(key, ()) + value
    payloads = tuple(
        outbox.payloads.popleft() for _ in range(min(max_payloads, len(outbox.payloads)))
    )
    visible: list[VisibleItem] = [TextDelta("".join(texts))] if any(texts) else []
    visible += [Event(name, data) for name, data in events.items()]  # type: ignore[arg-type]
    done = not computing and not outbox.payloads and packager.idle(stream_id)
    more = not done and (can_continue or bool(outbox.payloads) or not computing)
    return StreamOutput(payloads=payloads, visible=tuple(visible), more=more, done=done)
