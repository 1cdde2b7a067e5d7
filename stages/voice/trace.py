"""Timestamps of a voice answer's steps, for the latency benchmark's breakdown.

Off unless the environment sets ``OMNITRIO_VOICE_TRACE=1`` (benchmarks/voice_latency.py
``--trace`` does, for the server it starts). Then each voice stage logs one line per
step of an answer that the client cannot see (the speculative answer runs unseen until
the turn ends): the VAD's pause and end of turn, the ASR's start and end, the LLM's
first text, the TTS's first phrase complete and its first audio made. A line is
``voice-trace <what> <stream id> <seconds>`` on the system's monotonic clock, which the
benchmark's own process reads too (``time.monotonic``), so the two line up.
"""

from __future__ import annotations

import logging
import os
import threading
import time

ENV = "OMNITRIO_VOICE_TRACE"
ENABLED = os.environ.get(ENV) == "1"
_logger = logging.getLogger("stages.voice.trace")
if ENABLED:
    _logger.setLevel(logging.INFO)  # shown whatever the server's own log level


def mark(what: str, stream_id: str) -> None:
    """Log that ``what`` happened to ``stream_id`` now (only when tracing is on)."""
    if ENABLED:
        _logger.info("voice-trace %s %s %.6f", what, stream_id, time.monotonic())


def part(stream_id: str, kind: str, **seconds: float) -> None:
    """Log one audio part an answer's TTS made (its ``kind``, and timings in seconds:
    ``voice-part <kind> <stream id> <name>=<s> ...``; only when tracing is on)."""
    if ENABLED:
        values = " ".join(f"{name}={value:.4f}" for name, value in seconds.items())
        _logger.info("voice-part %s %s %s", kind, stream_id, values)


def text(stream_id: str, piece: str) -> None:
    """Log the text ``piece`` of ``stream_id``'s answer the LLM hands on now
    (``voice-text <stream id> <seconds> <text as a Python literal>``; only when tracing
    is on)."""
    if ENABLED:
        _logger.info("voice-text %s %.6f %r", stream_id, time.monotonic(), piece)


def held(stream_id: str, since_s: float, why: str) -> None:
    """Log that ``stream_id``'s answer held its next token from ``since_s`` until now
    (first_audio.py; ``voice-held <stream id> <since> <until> <why>``, ``why`` the
    streams it held for; only when tracing is on)."""
    if ENABLED:
        _logger.info("voice-held %s %.6f %.6f %s", stream_id, since_s, time.monotonic(), why)


def step(stage: str, started_s: float, size: int, spoke: list[str], cpu_started_s: float) -> None:
    """Log one step of ``stage``: when it started (``started_s``) and ended (now), how
    many streams its batch had, which of them it made audio for, the CPU time its thread
    spent on it (``cpu_started_s``: ``time.thread_time()`` at its start) and the thread's
    id (``voice-step <stage> <start> <end> <size> <ids, comma-separated, or -> <cpu s>
    <thread id>``; only when tracing is on). A step whose CPU time is far below its
    length waited for a core; one whose CPU time grew did more work, or ran slower."""
    if ENABLED:
        ids = ",".join(spoke) or "-"
        cpu = time.thread_time() - cpu_started_s
        _logger.info(
            "voice-step %s %.6f %.6f %d %s %.6f %d",
            stage,
            started_s,
            time.monotonic(),
            size,
            ids,
            cpu,
            threading.get_native_id(),
        )
