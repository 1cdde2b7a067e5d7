"""Nothing accepted and ignored on the HTTP API: every field of the openai SDK's request
types for chat completions and speech is honoured or refused by name, voices are
listed and checked, speech comes in OpenAI's six formats (each decoded here by
libsndfile, not by the server's FFmpeg), and every error is an OpenAI-style JSON error."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import openai.types.audio.speech_create_params as speech_params
import openai.types.chat.completion_create_params as chat_params
import pytest
import soundfile
import trio

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config

SPEAKING = [
    {"steps": 6, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
NUM_SAMPLES = 6 * 480  # what SPEAKING says, at the server's 24 kHz output rate
RATE_HZ = 24000
PROBE = {"probe": 1}  # a value that asks for something: honoured, or refused by name
CHAT = {"model": "test", "messages": [{"role": "user", "content": "hi"}]}
CHAT_HONOURED: dict[str, Any] = {
    "model": "test",
    "messages": [{"role": "user", "content": "hi"}],
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "stream": False,
    "stream_options": None,
    "max_tokens": 8,
    "max_completion_tokens": 8,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 7,
    "tools": [{"type": "function", "function": {"name": "f", "strict": True}}],
    "tool_choice": "auto",
    "n": 1,
    "parallel_tool_calls": False,
}
SPEECH = {"model": "test", "input": "hello"}
SPEECH_HONOURED: dict[str, Any] = {
    "model": "test",
    "input": "hello",
    "voice": "default",
    "response_format": "wav",
    "speed": 1.0,
}


@pytest.fixture
async def base_url(nursery: trio.Nursery) -> str:
    config = chain_config(SPEAKING, max_streams=4)
    binds = await nursery.start(serve, config, ServerSettings(port=0, max_message_bytes=4096))
    return str(binds[0])


def _call(
    url: str, body: bytes | None = None, method: str | None = None
) -> tuple[int, bytes, dict[str, str]]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), _lower(response.headers.items())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), _lower(exc.headers.items())


def _lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}


async def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    status, data, _ = await trio.to_thread.run_sync(_call, url, json.dumps(body).encode())
    return status, data


def _sdk_fields(typed: type) -> set[str]:
    return {name for klass in typed.__mro__ for name in getattr(klass, "__annotations__", {})}


async def _walk(url: str, base: dict[str, Any], fields: set[str], honoured: dict[str, Any]) -> None:
    """Each field alone with ``PROBE`` is a 400 naming it, unless omnitrio honours it (then
    its value in ``honoured`` works, all together)."""
    refused = sorted(fields - set(honoured))
    for name in refused:
        status, data = await _post(url, {**base, name: PROBE})
        error = json.loads(data)["error"]
        assert (status, error["param"]) == (400, name), (name, error)
        assert name in error["message"]
    assert set(honoured) <= fields | {"stream"}
    status, data = await _post(url, honoured)
    assert status == 200, data[:300]


async def test_every_chat_field_of_the_sdk_is_honoured_or_refused_by_name(base_url: str) -> None:
    fields = _sdk_fields(chat_params.CompletionCreateParamsBase) | {"stream"}
    await _walk(f"{base_url}/v1/chat/completions", CHAT, fields, CHAT_HONOURED)
    status, data = await _post(f"{base_url}/v1/chat/completions", {**CHAT, "n": 2})
    assert (status, json.loads(data)["error"]["param"]) == (400, "n")
    status, data = await _post(f"{base_url}/v1/chat/completions", {**CHAT, "colour": "red"})
    error = json.loads(data)["error"]
    assert (status, error["code"], error["param"]) == (400, "unknown_parameter", "colour")
    message = {"role": "user", "content": "hi", "name": "ann"}
    status, data = await _post(f"{base_url}/v1/chat/completions", {**CHAT, "messages": [message]})
    assert (status, json.loads(data)["error"]["param"]) == (400, "messages.0.name")


async def test_every_speech_field_of_the_sdk_is_honoured_or_refused_by_name(base_url: str) -> None:
    fields = _sdk_fields(speech_params.SpeechCreateParams)
    await _walk(f"{base_url}/v1/audio/speech", SPEECH, fields, SPEECH_HONOURED)
    status, data = await _post(f"{base_url}/v1/audio/speech", {**SPEECH, "speed": 1.5})
    error = json.loads(data)["error"]
    assert (status, error["param"]) == (400, "speed")
    assert "1.0" in error["message"]


async def test_voices_are_listed_and_an_unknown_one_is_refused_naming_them(
    base_url: str,
) -> None:
    status, data, _ = await trio.to_thread.run_sync(_call, f"{base_url}/v1/audio/voices")
    listed = {v["id"]: v["speaks_as"] for v in json.loads(data)["data"]}
    assert status == 200
    assert listed["default"] == "default"
    assert listed["marin"] == "default"  # OpenAI's names speak as the default voice
    for url, body, param in [
        (f"{base_url}/v1/audio/speech", {**SPEECH, "voice": "nobody"}, "voice"),
        (
            f"{base_url}/v1/chat/completions",
            {**CHAT, "modalities": ["audio"], "audio": {"voice": "nobody", "format": "wav"}},
            "audio.voice",
        ),
    ]:
        status, data = await _post(url, body)
        error = json.loads(data)["error"]
        assert (status, error["param"]) == (400, param)
        assert "default, alloy" in error["message"]


def _adts_frames(data: bytes) -> int:
    """The ADTS frames of an AAC stream, each checked for its sync word and length."""
    count, at = 0, 0
    while at < len(data):
        assert data[at] == 0xFF, at  # the sync word
        assert data[at + 1] & 0xF0 == 0xF0, at
        length = ((data[at + 3] & 0x03) << 11) | (data[at + 4] << 3) | (data[at + 5] >> 5)
        assert length > 7
        at, count = at + length, count + 1
    assert at == len(data)
    return count


@pytest.mark.parametrize(
    ("fmt", "mimetype"),
    [
        ("mp3", "audio/mpeg"),
        ("opus", "audio/ogg"),
        ("aac", "audio/aac"),
        ("flac", "audio/flac"),
        ("wav", "audio/wav"),
        ("pcm", "audio/pcm"),
    ],
)
async def test_speech_in_each_format_decodes(base_url: str, fmt: str, mimetype: str) -> None:
    body = {**SPEECH} if fmt == "mp3" else {**SPEECH, "response_format": fmt}  # mp3: default
    status, data, headers = await trio.to_thread.run_sync(
        _call, f"{base_url}/v1/audio/speech", json.dumps(body).encode()
    )
    assert status == 200
    assert headers["content-type"].startswith(mimetype)
    if fmt == "pcm":
        assert len(data) == NUM_SAMPLES * 2
        return
    if fmt == "aac":  # libsndfile has no AAC: the ADTS framing is checked instead
        assert _adts_frames(data) >= NUM_SAMPLES // 1024
        return
    samples, rate_hz = soundfile.read(io.BytesIO(data), dtype="int16")
    duration_s = len(samples) / rate_hz
    # mp3 and opus add their codec delay and padding; the lossless ones are exact.
    assert NUM_SAMPLES / RATE_HZ <= duration_s < NUM_SAMPLES / RATE_HZ + 0.1, duration_s
    if fmt in ("wav", "flac"):
        assert rate_hz == RATE_HZ
        assert np.count_nonzero(samples) > 0


async def test_every_error_is_openai_style_json(base_url: str) -> None:
    cases = [
        (f"{base_url}/v1/nope", None, "GET", 404),
        (f"{base_url}/v1/chat/completions", None, "GET", 405),
        (f"{base_url}/v1/chat/completions", b"x" * 5000, "POST", 413),
        (f"{base_url}/v1/chat/completions", b"{", "POST", 400),
    ]
    for url, body, method, expected in cases:
        status, data, headers = await trio.to_thread.run_sync(_call, url, body, method)
        assert status == expected
        assert headers["content-type"] == "application/json", (expected, headers)
        error = json.loads(data)["error"]
        assert error["message"]
        assert error["type"] == "invalid_request_error"
