"""A speech body and its audio bytes without a server (omnitrio/server/_speech.py)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from omnitrio._items import AudioChunk, Event, TextDelta
from omnitrio.server._capabilities import OPENAI_VOICES, Voices
from omnitrio.server._requests import BadRequest
from omnitrio.server._speech import SpeechAudio, SpeechCall, prepare_speech

VOICES = Voices(own=("default",), aliases=OPENAI_VOICES)


def prepare(**body: Any) -> SpeechCall:
    return prepare_speech(json.dumps({"model": "tts", "input": "Hello.", **body}).encode(), VOICES)


def test_a_speech_body_asks_the_pipeline_to_say_its_input() -> None:
    call = prepare(voice="alloy")
    assert call.request.text == "Hello."
    options = call.request.options
    assert (options.task, options.modalities, options.voice) == ("speak", ("audio",), "alloy")
    assert call.speech.response_format == "mp3"  # OpenAI's default
    assert call.mimetype == "audio/mpeg"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"voice": "nobody"}, "voice", "invalid_value"),
        ({"speed": 1.5}, "speed", "unsupported_parameter"),
        ({"input": ""}, "input", "invalid_request"),
        ({"response_format": "ogg"}, "response_format", "invalid_request"),
    ],
)
def test_a_bad_speech_body_names_the_field(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(BadRequest) as caught:
        prepare(**body)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_pcm_speech_is_the_resampled_audio_and_nothing_else() -> None:
    audio = SpeechAudio(prepare(response_format="pcm"), 24000)
    assert audio.take(TextDelta("Hello.")) == b""
    assert audio.take(Event("transcript", {"text": "Hello."})) == b""
    assert len(audio.take(AudioChunk(b"\x01\x00" * 1600, 16000))) == 2 * 2400
    assert audio.close() == b""


def test_mp3_speech_is_one_continuous_file() -> None:
    av = pytest.importorskip("av")
    audio = SpeechAudio(prepare(), 24000)
    data = b"".join(audio.take(AudioChunk(b"\x00\x10" * 2400, 24000)) for _ in range(10))
    data += audio.close()
    with av.open(io.BytesIO(data)) as container:
        assert container.format.name == "mp3"
        frames = sum(frame.samples for frame in container.decode(audio=0))
    assert frames >= 24000 * 9 // 10  # 1 s encoded (the encoder's delay aside)
