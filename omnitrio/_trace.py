"""Timestamps of an answer's first audio on its way out of the server, for the latency
benchmark: where a transport (the WebSocket, a WebRTC call) takes it, and when a
call's track sends it.

Off unless the environment sets ``OMNITRIO_VOICE_TRACE=1`` (benchmarks/voice_latency.py
``--trace`` does, as for the voice stages' own steps). A line is ``voice-trace <what>
<id> <seconds>`` on the system's monotonic clock, which the benchmark reads too.
"""

from __future__ import annotations

import logging
import os
import time

ENABLED = os.environ.get("OMNITRIO_VOICE_TRACE") == "1"
_logger = logging.getLogger("omnitrio.trace")
if ENABLED:
    _logger.setLevel(logging.INFO)  # shown whatever the server's own log level


def mark(what: str, key: str) -> None:
    """Log that ``what`` happened to ``key`` (a response or item id) now, when on."""
    if ENABLED:
        _logger.info("voice-trace %s %s %.6f", what, key, time.monotonic())
