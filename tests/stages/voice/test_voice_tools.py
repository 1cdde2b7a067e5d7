"""Function calling over Realtime on the offline voice chat (configs/voice-chat.yaml),
through the official ``openai`` SDK: the weather tool round trip by text and by voice."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import trio

from omnitrio.server import ServerSettings, serve
from tests.voice_support import VOICE_CONFIG, needs_voice, spoken

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

TURN_TIMEOUT_S = 240.0  # generous: the machine is shared
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def _until_done(conn: Any) -> tuple[list[Any], Any]:
    """Events up to response.done (each parsed by the SDK into its own type)."""
    events = []
    for event in conn:
        events.append(event)
        if event.type == "error":
            raise AssertionError(f"error event: {event.error}")
        if event.type == "response.done":
            return events, event.response
    raise AssertionError("connection ended before response.done")


def _call_and_answer(conn: Any, events: list[Any], response: Any) -> str:
    """Check the call the model made, send the weather back, return the spoken answer."""
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.name == "get_weather"
    arguments = json.loads(done.arguments)
    jsonschema.validate(arguments, WEATHER["parameters"])
    (item,) = response.output
    assert item.type == "function_call"
    assert (item.call_id, item.arguments) == (done.call_id, done.arguments)
    assert not any(t.startswith("response.output_audio") for t in types)  # a call is not said

    result = {"city": arguments["city"], "sky": "sunny", "temperature": 24}
    conn.conversation.item.create(
        item={"type": "function_call_output", "call_id": done.call_id, "output": json.dumps(result)}
    )
    conn.response.create(response={"tool_choice": "none"})
    events, response = _until_done(conn)
    assert response.status == "completed"
    transcript = "".join(
        e.delta for e in events if e.type == "response.output_audio_transcript.delta"
    )
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert transcript.strip()
    assert audio  # the answer is spoken
    return transcript


async def _client(nursery: trio.Nursery) -> openai.OpenAI:
    binds = await nursery.start(serve, VOICE_CONFIG, ServerSettings(port=0))
    return openai.OpenAI(base_url=f"{binds[0]}/v1", api_key="unused", max_retries=0)


async def test_weather_round_trip_by_text(nursery: trio.Nursery) -> None:
    client = await _client(nursery)

    def run() -> str:
        with client.realtime.connect(model="voice-chat") as conn:
            assert conn.recv().type == "session.created"
            conn.session.update(
                session={"type": "realtime", "tools": [WEATHER], "tool_choice": "required"}
            )
            assert conn.recv().type == "session.updated"
            text = {"type": "input_text", "text": "What is the weather like in Paris?"}
            conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [text]}
            )
            conn.response.create()
            events, response = _until_done(conn)
            return _call_and_answer(conn, events, response)

    with trio.fail_after(TURN_TIMEOUT_S):
        await trio.to_thread.run_sync(run)


async def test_weather_round_trip_by_voice(nursery: trio.Nursery, tmp_path: Path) -> None:
    client = await _client(nursery)
    question = spoken("What is the weather like in Paris?", tmp_path / "q.wav", silence_after_s=1.5)

    def run() -> tuple[str, str]:
        with client.realtime.connect(model="voice-chat") as conn:
            assert conn.recv().type == "session.created"
            named = {"type": "function", "name": "get_weather"}
            conn.session.update(
                session={"type": "realtime", "tools": [WEATHER], "tool_choice": named}
            )
            assert conn.recv().type == "session.updated"
            chunk = 4800  # 0.1 s at 24 kHz
            for start in range(0, len(question), chunk):
                piece = base64.b64encode(question[start : start + chunk]).decode()
                conn.input_audio_buffer.append(audio=piece)
            events, response = _until_done(conn)
            heard = next(
                e.transcript
                for e in events
                if e.type == "conversation.item.input_audio_transcription.completed"
            )
            return heard, _call_and_answer(conn, events, response)

    with trio.fail_after(TURN_TIMEOUT_S):
        heard, _ = await trio.to_thread.run_sync(run)
    assert "paris" in heard.lower()
