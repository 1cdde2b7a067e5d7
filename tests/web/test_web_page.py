"""The voice-chat page in real headless Chromium against a real ``omnitrio run``.

Chromium's fake media flags feed a WAV file as the microphone. The page connects
over the Realtime WebSocket, answers a text turn and a push-to-talk turn with
audio, and reports what it saw through ``window.omnitrio``. Barge-in is checked
both ways (pressing Talk over a playing reply, and Stop): playback must go silent
at once, i.e. the seconds played stop growing. A screenshot goes to
``test-artifacts/web_page.png``.

A plain (sync) test: Playwright's sync API runs its own event loop, which must
not be nested inside trio's.
"""

from __future__ import annotations

import array
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "test-artifacts" / "web_page.png"
SERVER_START_TIMEOUT_S = 20.0
SERVER_STOP_TIMEOUT_S = 5.0
TURN_TIMEOUT_MS = 10_000
STOP_WITHIN_MS = 200  # a barge-in must silence playback this fast
STILL_STOPPED_MS = 300  # ... and it must stay silent for at least this long after
MID_PLAYBACK_LEFT_S = 0.2  # barge in while at least this much of the reply is unplayed
PLAYED_SLACK_S = 0.01  # resampling may drop a sample or so of each reply
SERVING = re.compile(r"omnitrio serving .* at (https?://[^\s,]+)")


def fake_microphone_args(wav: Path) -> list[str]:
    """Chromium flags: ``wav`` as the microphone, autoplay allowed, nothing fetched."""
    return [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--autoplay-policy=no-user-gesture-required",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ]


@contextmanager
def chromium_page(
    chromium: Path, args: list[str], timeout_ms: float
) -> Iterator[tuple[Page, list[str]]]:
    """A page in headless Chromium launched with ``args``, and the list its uncaught
    errors go to; the browser is closed on the way out."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=args)
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout_ms)
            page_errors: list[str] = []
            page.on("pageerror", lambda error: page_errors.append(str(error)))
            yield page, page_errors
        finally:
            browser.close()


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    """``omnitrio run`` on a free port; its output goes to a file, so it never blocks on a pipe."""
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "omnitrio._cli", "run"]
    command += ["--config", "configs/synthetic.yaml", "--port", "0"]
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        yield _wait_until_serving(server, log_path)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_until_serving(server: subprocess.Popen[bytes], log_path: Path) -> str:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    output = ""
    while time.monotonic() < deadline:
        output = log_path.read_text(errors="replace")
        if found := SERVING.search(output):
            return found.group(1)
        if server.poll() is not None:
            pytest.fail(f"omnitrio run exited with {server.returncode}:\n{output}")
        time.sleep(0.05)  # a subprocess's output file has nothing to wait on
    pytest.fail(f"omnitrio run printed no URL in {SERVER_START_TIMEOUT_S} s:\n{output}")


def _microphone_wav(path: Path) -> Path:
    """2 s of a 440 Hz tone with a little noise: 16-bit mono 48 kHz."""
    rate_hz, seconds = 48_000, 2.0
    noise = random.Random(0)
    samples = array.array(
        "h",
        (
            int(8000 * math.sin(2 * math.pi * 440 * n / rate_hz) + noise.gauss(0, 300))
            for n in range(int(rate_hz * seconds))
        ),
    )
    if sys.byteorder == "big":
        samples.byteswap()  # WAV data is little-endian
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate_hz)
        wav.writeframes(samples.tobytes())
    return path


def test_voice_chat_page(tmp_path: Path, chromium: Path, server_url: str) -> None:
    wav = _microphone_wav(tmp_path / "microphone.wav")
    args = fake_microphone_args(wav)
    with chromium_page(chromium, args, TURN_TIMEOUT_MS) as (page, page_errors):
        page.on(
            "console",
            lambda msg: page_errors.append(msg.text) if msg.type == "error" else None,
        )

        page.goto(f"{server_url}/?transport=websocket")  # this test is of the WebSocket path
        assert page.text_content("#hint") == "Press Connect to start."
        page.click("#connect")
        page.wait_for_function("window.omnitrio.state === 'connected'")
        # The synthetic pipeline detects no turns: no Hands-free button, nor a hint of it.
        hint = page.text_content("#hint") or ""
        assert "press Talk" in hint
        assert "Hands-free" not in hint
        assert page.is_hidden("#hands-free")

        # (a) A text turn: audio and a transcript stream back.
        page.fill("#text", "Hello from the browser test")
        page.click("#send")
        page.wait_for_function(
            "window.omnitrio.audioSecondsReceived > 0"
            " && window.omnitrio.transcript.length > 0"
            " && window.omnitrio.eventCounts['response.done'] === 1"
        )
        first_audio_s = page.evaluate("window.omnitrio.audioSecondsReceived")

        # (b) Talking over the reply barges in: playback stops at once.
        _wait_until_mid_playback(page, 0.0)
        page.click("#talk")
        cut_s = _assert_playback_stopped(page)

        # (c) A push-to-talk turn: ~1 s from the fake microphone, then a second reply,
        # which plays to the end.
        page.wait_for_function("window.omnitrio.audioSecondsSent >= 1.0")
        page.click("#talk")
        page.wait_for_function(
            f"window.omnitrio.audioSecondsReceived > {first_audio_s}"
            " && window.omnitrio.eventCounts['response.done'] === 2"
        )
        second_audio_s = page.evaluate("window.omnitrio.audioSecondsReceived") - first_audio_s
        page.wait_for_function(
            f"window.omnitrio.audioSecondsPlayed >= {cut_s + second_audio_s - PLAYED_SLACK_S}"
        )

        # (d) A third reply, stopped with the Stop button while it plays.
        played_s = page.evaluate("window.omnitrio.audioSecondsPlayed")
        page.fill("#text", "And once more")
        page.click("#send")
        # Once the server is done, Stop only has playback to silence; a response.cancel
        # racing response.done would earn an (ignored but counted) error event.
        page.wait_for_function("window.omnitrio.eventCounts['response.done'] === 3")
        _wait_until_mid_playback(page, played_s)
        page.click("#stop")
        _assert_playback_stopped(page)
        page.wait_for_function("document.querySelector('#stop').disabled")

        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        seen = page.evaluate("window.omnitrio")
        user_lines = page.eval_on_selector_all(
            "#transcript li.user", "lines => lines.map(li => li.textContent)"
        )

    # One user line per turn: the spoken one says how long it was (this pipeline has no
    # ASR to give its transcript), and no second line for it.
    assert len(user_lines) == 3, user_lines
    assert user_lines[0] == "Hello from the browser test"
    assert re.fullmatch(r"\(spoke for \d+\.\d s\)", user_lines[1]), user_lines
    assert user_lines[2] == "And once more"
    assert seen["eventCounts"]["input_audio_buffer.committed"] == 1
    # (c) Nothing went wrong on the way.
    assert seen["errors"] == []
    assert page_errors == []
    assert seen["state"] == "connected"
    assert seen["eventCounts"]["session.created"] == 1
    assert seen["eventCounts"].get("error", 0) == 0
    assert not seen["recording"]
    assert seen["playback"] == "worklet"
    assert isinstance(seen["underruns"], int)
    assert len(seen["firstAudioMs"]) == 3
    # Both barge-ins told the server how much of the reply was heard, and it took it.
    assert len(seen["truncatedAtMs"]) == 2, seen["truncatedAtMs"]
    assert all(ms > 0 for ms in seen["truncatedAtMs"])
    assert seen["eventCounts"]["conversation.item.truncated"] == 2


def _wait_until_mid_playback(page: Page, played_before_s: float) -> None:
    """Until the reply is audibly playing with at least MID_PLAYBACK_LEFT_S still to go."""
    page.wait_for_function(
        f"window.omnitrio.audioSecondsPlayed > {played_before_s}"
        " && window.omnitrio.audioSecondsPlayed < window.omnitrio.audioSecondsReceived"
        f" - {MID_PLAYBACK_LEFT_S}",
        polling=5,
    )


def _assert_playback_stopped(page: Page) -> float:
    """After a barge-in, seconds played settle within STOP_WITHIN_MS and stay short of
    what was received; returns them."""
    page.wait_for_timeout(STOP_WITHIN_MS)
    settled_s = page.evaluate("window.omnitrio.audioSecondsPlayed")
    page.wait_for_timeout(STILL_STOPPED_MS)
    seen = page.evaluate("window.omnitrio")
    assert seen["audioSecondsPlayed"] == settled_s, "playback went on after the barge-in"
    assert settled_s < seen["audioSecondsReceived"] - PLAYED_SLACK_S
    return settled_s
