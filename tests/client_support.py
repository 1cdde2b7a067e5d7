"""Shared by the client conformance tests (tests/server/test_clients.py): the voice chat as a
process, spoken audio in the frameworks' frame types, and the skip for a missing extra."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.voice_support import VOICE_CONFIG

REPO = Path(__file__).resolve().parent.parent
SERVING = re.compile(r"omnitrio serving .* at (http://[\d.]+:\d+)")
CLIENT_MODULES = ("livekit.agents", "livekit.plugins.openai", "pipecat", "aiohttp")
TURN_TIMEOUT_S = 240.0  # generous: the machine is shared
START_TIMEOUT_LINES = 400
RUN = (sys.executable, "-m", "omnitrio._cli", "--log-level", "WARNING", "run")


def missing_clients() -> list[str]:
    missing = []
    for name in CLIENT_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


needs_clients = pytest.mark.skipif(
    bool(missing_clients()),
    reason=(
        f"client packages missing: {', '.join(missing_clients())}; install omnitrio's "
        "`clients` extra (`scripts/setup dev,voice,clients`)"
    ),
)


def voice_chat_process() -> Iterator[str]:
    """``omnitrio run`` on the voice chat, in its own process; yields its base URL."""
    process = subprocess.Popen(
        [*RUN, "--config", str(VOICE_CONFIG), "--port", "0"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = None
    for _ in range(START_TIMEOUT_LINES):  # the server prints its URL once the stages load
        line = process.stdout.readline()
        if match := SERVING.search(line):
            url = match.group(1)
            break
        if not line:
            break
    if url is None:
        process.kill()
        raise AssertionError(f"the voice chat did not start (exit {process.wait()})")
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)
        process.stdout.close()
