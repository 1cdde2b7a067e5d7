"""Chat completions' audio.format: the speech endpoint's formats, by its PyAV encoder,
decoded here by an independent decoder (libsndfile); other formats refused by name."""

from __future__ import annotations

import base64
import io
import json

import pytest
import soundfile
import trio

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config
from tests.server.test_http_fields import NUM_SAMPLES, RATE_HZ, SPEAKING, _adts_frames, _call


@pytest.fixture
async def base_url(nursery: trio.Nursery) -> str:
    binds = await nursery.start(
        serve, chain_config(SPEAKING, max_streams=4), ServerSettings(port=0)
    )
    return str(binds[0])


def _chat(fmt: str, *, stream: bool = False) -> bytes:
    return json.dumps(
        {
            "model": "test",
            "messages": [{"role": "user", "content": "hi"}],
            "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": fmt},
            "stream": stream,
        }
    ).encode()


def _check(fmt: str, data: bytes) -> None:
    if fmt == "pcm16":
        assert len(data) == NUM_SAMPLES * 2
    elif fmt == "aac":  # libsndfile has no AAC: the ADTS framing is checked instead
        assert _adts_frames(data) >= NUM_SAMPLES // 1024
    else:
        samples, rate_hz = soundfile.read(io.BytesIO(data), dtype="int16")
        duration_s = len(samples) / rate_hz
        # mp3 and opus add their codec delay and padding; the lossless ones are exact.
        assert NUM_SAMPLES / RATE_HZ <= duration_s < NUM_SAMPLES / RATE_HZ + 0.1, duration_s


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm16"])
async def test_chat_audio_in_each_format_decodes(base_url: str, fmt: str) -> None:
    url = f"{base_url}/v1/chat/completions"
    status, body, _ = await trio.to_thread.run_sync(_call, url, _chat(fmt))
    assert status == 200, body
    audio = json.loads(body)["choices"][0]["message"]["audio"]
    _check(fmt, base64.b64decode(audio["data"]))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
async def test_streamed_chat_audio_deltas_join_into_one_file(base_url: str, fmt: str) -> None:
    url = f"{base_url}/v1/chat/completions"
    status, body, _ = await trio.to_thread.run_sync(_call, url, _chat(fmt, stream=True))
    assert status == 200, body
    data = b""
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                audio = choice["delta"].get("audio") or {}
                data += base64.b64decode(audio.get("data", ""))
    _check(fmt, data)


async def test_another_audio_format_is_refused_naming_the_choices(base_url: str) -> None:
    url = f"{base_url}/v1/chat/completions"
    status, body, _ = await trio.to_thread.run_sync(_call, url, _chat("ogg"))
    assert status == 400
    error = json.loads(body)["error"]
    assert error["param"] == "audio.format"
    assert "'mp3'" in error["message"]
    assert "'flac'" in error["message"]
