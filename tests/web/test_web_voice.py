"""The voice chat page in headless Chromium against ``omnitrio run`` on its default
pipeline (the offline voice chat): a spoken question from the fake microphone,
hands-free (server_vad), and a spoken answer whose audio says the answer's text.

The question is a WAV made by espeak-ng here; Chromium plays it as the microphone.
The answer's audio, kept by the page, is transcribed by a separate ASR instance.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omnitrio import resample_float
from stages.voice.pcm import float_to_pcm16, pcm16_to_float
from tests.voice_support import (
    INPUT_RATE_HZ,
    MAX_WER,
    REPO,
    needs_voice,
    spoken,
    transcribe_pcm16,
    word_error_rate,
    write_wav,
)
from tests.web.test_web_page import SERVING, chromium_page, fake_microphone_args

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

QUESTION = "What do cats like to eat?"
MICROPHONE_RATE_HZ = 48_000
LEAD_IN_S = 1.0  # the capture may start a moment after the file does
SILENCE_AFTER_S = 15.0  # Chromium loops the file: the question must come only once per turn
SERVER_START_TIMEOUT_S = 180.0  # a first run converts the LLM's weights
TURN_TIMEOUT_MS = 90_000


# The fake microphone is a clean file: turn off the voice processing meant for real rooms.
RAW_MICROPHONE = """
const getUserMedia = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
navigator.mediaDevices.getUserMedia = (constraints) => getUserMedia({
  audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false,
           autoGainControl: false },
});
"""


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[str]:
    """``omnitrio run`` with no --config: the default pipeline."""
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "omnitrio._cli", "run", "--port", "0"]
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not (found := SERVING.search(output := log_path.read_text(errors="replace"))):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"omnitrio run did not start:\n{output}")
            time.sleep(0.1)  # a subprocess's output file has nothing to wait on
        assert "voice-chat" in output
        yield found.group(1)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            pytest.fail("omnitrio run did not stop on SIGTERM within 15 s")


def _microphone_wav(tmp_path: Path) -> Path:
    pcm16 = spoken(QUESTION, tmp_path / "question.wav", silence_after_s=SILENCE_AFTER_S)
    lead_in = np.zeros(int(LEAD_IN_S * INPUT_RATE_HZ), dtype=np.float32)
    question = np.concatenate([lead_in, pcm16_to_float(pcm16)])
    samples = resample_float(question, INPUT_RATE_HZ, MICROPHONE_RATE_HZ)
    path = tmp_path / "microphone.wav"
    write_wav(path, float_to_pcm16(samples.astype(np.float32)), MICROPHONE_RATE_HZ)
    return path


def test_hands_free_spoken_turn_in_the_browser(
    tmp_path: Path, chromium: Path, default_server: str
) -> None:
    wav = _microphone_wav(tmp_path)
    args = fake_microphone_args(wav)
    with chromium_page(chromium, args, TURN_TIMEOUT_MS) as (page, page_errors):
        page.add_init_script(RAW_MICROPHONE)
        page.goto(f"{default_server}/?transport=websocket")  # this test is of the WebSocket path
        page.click("#connect")
        page.wait_for_function("window.omnitrio.state === 'connected'")
        page.wait_for_function("window.omnitrio.serverVad")
        assert "Hands-free" in (page.text_content("#hint") or "")  # the page says so
        page.evaluate("window.omnitrio.keepAudio = true")
        page.click("#hands-free")
        assert "Hands-free: just talk" in (page.text_content("#hint") or "")
        page.wait_for_function(
            "window.omnitrio.userTranscripts.length >= 1"
            " && (window.omnitrio.eventCounts['response.done'] || 0) >= 1"
        )
        page.click("#hands-free")  # stop listening before the file loops
        seen = page.evaluate("window.omnitrio")
        user_lines = page.eval_on_selector_all(
            "#transcript li.user", "lines => lines.map(li => li.textContent)"
        )

    assert page_errors == []
    assert seen["errors"] == []
    assert seen["eventCounts"]["input_audio_buffer.speech_started"] >= 1
    assert seen["eventCounts"]["input_audio_buffer.speech_stopped"] >= 1
    # The page asks the browser for echo cancellation and noise suppression, which
    # colour espeak's voice; the question needs only to be recognisably the question.
    sent = b"".join(base64.b64decode(chunk) for chunk in seen["sentAudio"])
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    write_wav(REPO / "test-artifacts" / "web_voice_sent.wav", sent, INPUT_RATE_HZ)
    heard_question = seen["userTranscripts"][0].lower()
    # The spoken turn is one user line, which now says what was heard.
    assert user_lines[0] == seen["userTranscripts"][0], user_lines
    assert "cat" in heard_question, heard_question
    assert "eat" in heard_question, heard_question
    assert seen["firstAudioMs"], "no first-audio time: the answer never played"
    answer_text = seen["transcript"]
    audio = b"".join(base64.b64decode(delta) for delta in seen["replyAudio"])
    heard = transcribe_pcm16(audio, INPUT_RATE_HZ)
    wer = word_error_rate(answer_text, heard)
    assert wer <= MAX_WER, f"WER {wer:.2f}: said {answer_text!r}, heard {heard!r}"
