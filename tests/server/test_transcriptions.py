"""/v1/audio/transcriptions on the voice chat's ASR stage, through the official SDK:
WAV and MP3 uploads (decoded by PyAV), the json, text and verbose_json formats."""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import trio

from omnitrio.server import ServerSettings, serve
from tests.server.test_audio_gate import encoded
from tests.voice_support import INPUT_RATE_HZ, VOICE_CONFIG, needs_voice, spoken, word_error_rate

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

SENTENCE = "What do cats like to eat?"
SYNTHETIC_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "synthetic.yaml"


def _mp3(pcm16: bytes, rate_hz: int) -> bytes:
    """``pcm16`` encoded as MP3 by PyAV (FFmpeg's LAME)."""
    return encoded("mp3", "mp3", rate_hz, samples=np.frombuffer(pcm16, dtype=np.int16)[None, :])


async def test_transcriptions_of_wav_and_mp3_in_every_format(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    binds = await nursery.start(serve, VOICE_CONFIG, ServerSettings(port=0))
    client = openai.OpenAI(base_url=f"{binds[0]}/v1", api_key="unused", max_retries=0)
    wav_path = tmp_path / "fox.wav"
    pcm16 = spoken(SENTENCE, wav_path)
    with wave.open(str(wav_path), "rb") as wav:
        assert wav.getframerate() == INPUT_RATE_HZ
    mp3 = _mp3(pcm16, INPUT_RATE_HZ)

    def run() -> None:
        files = {"fox.wav": wav_path.read_bytes(), "fox.mp3": mp3}
        for name, data in files.items():
            plain = client.audio.transcriptions.create(
                model="voice-chat", file=(name, data), response_format="json"
            )
            assert word_error_rate(SENTENCE, plain.text) <= 0.15, (name, plain.text)
        text = client.audio.transcriptions.create(
            model="voice-chat", file=("fox.mp3", mp3), response_format="text"
        )
        assert isinstance(text, str)
        assert word_error_rate(SENTENCE, text) <= 0.15, text
        verbose = client.audio.transcriptions.create(
            model="voice-chat",
            file=("fox.wav", wav_path.read_bytes()),
            response_format="verbose_json",
        )
        assert verbose.language == "en"
        assert verbose.duration == pytest.approx(len(pcm16) / 2 / INPUT_RATE_HZ, abs=0.05)
        assert word_error_rate(SENTENCE, verbose.text) <= 0.15
        # Every other field of the SDK's request: honoured (these values), or refused by name.
        honoured = client.audio.transcriptions.create(
            model="any-name",
            file=("fox.wav", wav_path.read_bytes()),
            response_format="verbose_json",
            language="en",
            temperature=0,
            timestamp_granularities=["segment"],
            chunking_strategy="auto",
        )
        [segment] = honoured.segments or []
        assert segment.start == 0.0
        assert segment.end == pytest.approx(honoured.duration)
        assert segment.text == honoured.text
        probes: dict[str, Any] = {
            "language": "fr",
            "prompt": "cats",
            "temperature": 0.5,
            "timestamp_granularities": ["word"],
            "include": ["logprobs"],
            "chunking_strategy": {"type": "server_vad"},
            "known_speaker_names": ["ann"],
            "known_speaker_references": ["data:audio/wav;base64,AAAA"],
            "extra_body": {"keywords": ["cat"], "languages": ["en"], "colour": "red"},
        }
        for name, value in probes.items():
            with pytest.raises(openai.BadRequestError) as refused:
                client.audio.transcriptions.create(
                    model="voice-chat", file=("fox.wav", b"RIFF"), **{name: value}
                )
            error = refused.value.body
            assert isinstance(error, dict)
            expected = list(value) if name == "extra_body" else [name]
            assert error["param"] in expected, error
        with pytest.raises(openai.BadRequestError, match="file"):
            client.audio.transcriptions.create(
                model="voice-chat", file=("noise.wav", b"not audio at all")
            )

    with trio.fail_after(240):
        await trio.to_thread.run_sync(run)


async def test_an_upload_over_the_input_limits_is_a_400_naming_the_limit(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Decoded audio is held to ``max_input_audio_s`` as it decodes."""
    settings = ServerSettings(port=0, max_input_audio_s=1.0)
    binds = await nursery.start(serve, VOICE_CONFIG, settings)
    client = openai.OpenAI(base_url=f"{binds[0]}/v1", api_key="unused", max_retries=0)
    three_s = np.zeros(3 * INPUT_RATE_HZ, dtype=np.int16).tobytes()

    def run() -> None:
        for name, data in {"long.mp3": _mp3(three_s, INPUT_RATE_HZ)}.items():
            with pytest.raises(openai.BadRequestError, match="over the limit of 1 s"):
                client.audio.transcriptions.create(model="voice-chat", file=(name, data))

    with trio.fail_after(60):
        await trio.to_thread.run_sync(run)


async def test_a_pipeline_without_an_asr_stage_answers_404_and_stays_up(
    nursery: trio.Nursery,
) -> None:
    """No stage declares the transcribe task: a 404 naming the pipeline, before the
    upload is decoded (it was a 200 with empty text); the server keeps serving."""
    binds = await nursery.start(serve, SYNTHETIC_CONFIG, ServerSettings(port=0))
    client = openai.OpenAI(base_url=f"{binds[0]}/v1", api_key="unused", max_retries=0)
    one_s = np.zeros(INPUT_RATE_HZ, dtype=np.int16).tobytes()

    def run() -> None:
        for data in (_mp3(one_s, INPUT_RATE_HZ), b"not audio at all"):
            with pytest.raises(openai.NotFoundError) as caught:
                client.audio.transcriptions.create(model="synthetic", file=("a.mp3", data))
            error = caught.value.body
            assert isinstance(error, dict)
            assert error["code"] == "unsupported_endpoint"
            assert "pipeline 'synthetic-omni' has no speech-recognition stage" in error["message"]
        reply = client.chat.completions.create(
            model="synthetic", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content

    with trio.fail_after(60):
        await trio.to_thread.run_sync(run)
