"""A chat completions body parsed and checked into a typed call (omnitrio/server/_chat.py),
without a server: the pipeline request it asks for, or the error naming the field."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from omnitrio._items import AudioInput
from omnitrio.server import ServerSettings
from omnitrio.server._audio import wav_bytes
from omnitrio.server._capabilities import OPENAI_VOICES, Voices
from omnitrio.server._chat import INLINE_BODY_BYTES, ChatCall, is_costly, prepare_chat
from omnitrio.server._requests import BadRequest

SETTINGS = ServerSettings(max_output_tokens=100)
VOICES = Voices(own=("default", "warm"), aliases=OPENAI_VOICES)


def prepare(**body: Any) -> ChatCall:
    body.setdefault("model", "voice")
    body.setdefault("messages", [{"role": "user", "content": "hello"}])
    return prepare_chat(json.dumps(body).encode(), SETTINGS, VOICES)


def refused(**body: Any) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        prepare(**body)
    return caught.value


def test_messages_become_the_pipeline_request() -> None:
    call = prepare(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
            },
        ],
        max_completion_tokens=20,
        temperature=0.5,
        seed=7,
    )
    assert call.request.text == "system: be brief\nuser: hi there"
    assert call.request.audio is None
    options = call.request.options
    assert (options.modalities, options.max_tokens, options.temperature, options.seed) == (
        ("text",),
        20,
        0.5,
        7,
    )
    assert call.chat.stream is False


def test_an_input_audio_part_becomes_the_request_audio() -> None:
    pcm16 = b"\x10\x00" * 1600
    data = base64.b64encode(wav_bytes(pcm16, 16000)).decode()
    part = {"type": "input_audio", "input_audio": {"format": "wav", "data": data}}
    call = prepare(
        messages=[{"role": "user", "content": [part]}],
        modalities=["text", "audio"],
        audio={"voice": "warm", "format": "wav"},
    )
    assert call.request.audio == AudioInput(pcm16, 16000)
    assert call.request.options.modalities == ("text", "audio")
    assert call.request.options.voice == "warm"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"stop": ["x"]}, "stop", "unsupported_parameter"),
        ({"colour": "blue"}, "colour", "unknown_parameter"),
        ({"max_tokens": 101}, "max_tokens", "invalid_value"),  # the server's cap
        ({"modalities": ["text", "audio"]}, "audio", "invalid_request"),
        ({"audio": {"voice": "nobody"}, "modalities": ["audio"]}, "audio.voice", "invalid_value"),
        (
            {"messages": [{"role": "tool", "content": "42"}]},
            "messages.0.tool_call_id",
            "unsupported_content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content.0",
            "unsupported_content",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_audio", "input_audio": {"format": "wav", "data": "!"}}
                        ],
                    }
                ]
            },
            "messages.0.content.0.input_audio.data",
            "unsupported_content",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools.0.function.name",
            "invalid_value",
        ),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(
    body: dict[str, Any], param: str, code: str
) -> None:
    error = refused(**body)
    assert (error.param, error.code, error.status) == (param, code, 400)
    assert str(error).startswith(param) or repr(param) in str(error)


def test_an_unknown_voice_names_the_choices() -> None:
    error = refused(audio={"voice": "nobody"}, modalities=["audio"])
    assert "default, warm" in str(error)


def test_tools_audio_and_long_bodies_are_checked_off_the_event_loop() -> None:
    assert not is_costly(b'{"model": "m", "messages": []}')
    assert is_costly(b'{"tools": []}')
    assert is_costly(b'{"input_audio": {}}')
    assert is_costly(b" " * (INLINE_BODY_BYTES + 1))
