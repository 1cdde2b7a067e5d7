"""The voice chat page over WebRTC, in real headless Chromium, against ``omnitrio run``
on its default pipeline (the offline voice chat).

Chromium's fake microphone plays a WAV of a spoken question (the Piper voice, made
here). The page connects over WebRTC by default (POST /v1/realtime/calls), streams the
microphone as its track with server_vad (Hands-free), and plays the answer from the
remote track. The test records that track in the page (MediaRecorder), transcribes it
with a separate ASR instance (the answer must say the answer's text, as the page shows
it), and reads Chromium's own receive statistics: no packet lost, little audio concealed.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import av
import numpy as np

from omnitrio import resample_float
from stages.voice.pcm import float_to_pcm16
from tests.voice_support import MAX_WER, transcribe_pcm16, word_error_rate
from tests.web.test_web_page import chromium_page, fake_microphone_args
from tests.web.test_web_voice import (
    RAW_MICROPHONE,
    TURN_TIMEOUT_MS,
    _microphone_wav,
    default_server,  # noqa: F401 (the fixture)
    pytestmark,  # noqa: F401 (needs the voice packages and weights)
)

RECORDED_RATE_HZ = 16_000
MAX_CONCEALED_SHARE = 0.03

# What the page asks getUserMedia for, kept before RAW_MICROPHONE turns the browser's
# voice processing off for the clean fake microphone.
ASKED = """
window.askedAudio = [];
const ask = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
navigator.mediaDevices.getUserMedia = (constraints) => {
  window.askedAudio.push(constraints.audio);
  return ask(constraints);
};
"""


def _decoded(webm: bytes) -> bytes:
    """The recorded WebM/Opus as PCM16 mono at RECORDED_RATE_HZ."""
    samples: list[np.ndarray] = []
    rate_hz = 48_000
    with av.open(io.BytesIO(webm)) as container:
        for frame in container.decode(audio=0):
            rate_hz = frame.sample_rate
            data = frame.to_ndarray().astype(np.float32)
            if frame.format.is_planar:
                samples.append(data.mean(axis=0))
            else:
                samples.append(data.reshape(-1, len(frame.layout.channels)).mean(axis=1))
    mono = np.concatenate(samples) if samples else np.zeros(0, np.float32)
    if np.abs(mono).max(initial=0) > 1.5:  # integer samples
        mono = mono / 32768
    return float_to_pcm16(resample_float(mono.astype(np.float32), rate_hz, RECORDED_RATE_HZ))


def test_a_spoken_turn_over_webrtc_in_the_browser(
    tmp_path: Path,
    chromium: Path,
    default_server: str,  # noqa: F811
) -> None:
    wav = _microphone_wav(tmp_path)
    args = [*fake_microphone_args(wav), "--allow-loopback-in-peer-connection"]
    with chromium_page(chromium, args, TURN_TIMEOUT_MS) as (page, page_errors):
        page.add_init_script(RAW_MICROPHONE)
        page.add_init_script(ASKED)  # runs after RAW_MICROPHONE: sees the page's ask
        page.goto(f"{default_server}/")
        page.click("#connect")
        page.wait_for_function("window.omnitrio.state === 'connected'")
        assert page.evaluate("window.omnitrio.transport") == "webrtc"
        page.wait_for_function("window.omnitrio.serverVad")
        page.evaluate("window.reply = window.omnitrio.rtc.recordReply()")
        page.click("#hands-free")
        page.wait_for_function(
            "window.omnitrio.userTranscripts.length >= 1"
            " && (window.omnitrio.eventCounts['response.done'] || 0) >= 1"
            " && (window.omnitrio.eventCounts['output_audio_buffer.stopped'] || 0) >= 1"
        )
        page.click("#hands-free")  # stop listening before the file loops
        stats = page.evaluate("window.omnitrio.rtc.stats()")
        recorded = base64.b64decode(page.evaluate("window.reply.stop()"))
        seen = page.evaluate("window.omnitrio")
        asked = page.evaluate("window.askedAudio")

    assert page_errors == []
    assert seen["errors"] == []
    assert seen["fallbackReason"] is None
    assert asked
    assert asked[0]["echoCancellation"] is True
    assert asked[0]["noiseSuppression"] is True
    assert "cat" in seen["userTranscripts"][0].lower(), seen["userTranscripts"]
    assert seen["firstAudioMs"], "no output_audio_buffer.started: the answer never played"
    assert seen["eventCounts"].get("response.output_audio.delta") is None  # it came on the track
    # Loopback: no packet of the answer is lost. A few may come late when the server's
    # WebRTC thread is starved of the GIL by the stages on CI's two cores (seen: 0, and
    # 129 ms of 12 s): Chromium then conceals them. Bounded, not zero (docs/benchmarks-voice.md).
    assert stats["packetsLost"] == 0, stats
    concealed = stats["concealedSamples"] - stats["silentConcealedSamples"]
    assert concealed <= MAX_CONCEALED_SHARE * stats["totalSamplesReceived"], stats
    answer_text = seen["transcript"]
    heard = transcribe_pcm16(_decoded(recorded), RECORDED_RATE_HZ)
    wer = word_error_rate(answer_text, heard)
    assert wer <= MAX_WER, f"WER {wer:.2f}: said {answer_text!r}, heard {heard!r}"
