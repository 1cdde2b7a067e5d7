"""A chat completion's answer formatted without a server (omnitrio/server/_chat_answer.py):
streamed chunks and whole bodies, each validated against the openai SDK's own types."""

from __future__ import annotations

import base64
import io
import json
import wave
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from omnitrio._items import AudioChunk, Event, TextDelta
from omnitrio.server._chat_answer import ChatAnswer, ChatItem
from omnitrio.server._requests import ChatRequest
from omnitrio.tools import FINISH_EVENT, TOOL_ARGUMENTS_EVENT, TOOL_CALL_EVENT, TOOL_DONE_EVENT

RATE_HZ = 24000


def answer(**body: Any) -> ChatAnswer:
    chat = ChatRequest.model_validate(
        {"model": "voice", "messages": [{"role": "user", "content": "hi"}], **body}
    )
    return ChatAnswer(chat, "voice", RATE_HZ)


def streamed(chat: ChatAnswer, items: list[ChatItem]) -> list[dict[str, Any]]:
    """Every chunk's JSON (validated as the SDK's ChatCompletionChunk); [DONE] last."""
    raw = [chat.opening()]
    for item in items:
        raw += chat.chunks(item)
    raw += chat.closing()
    assert all(r.startswith(b"data: ") and r.endswith(b"\n\n") for r in raw)
    assert raw[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(r.removeprefix(b"data: ")) for r in raw[:-1]]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    return chunks


TOOL_ITEMS: list[ChatItem] = [
    Event(TOOL_CALL_EVENT, {"call_id": "call_1", "name": "weather"}),
    Event(TOOL_ARGUMENTS_EVENT, {"call_id": "call_1", "delta": '{"city": '}),
    Event(TOOL_ARGUMENTS_EVENT, {"call_id": "call_1", "delta": '"Oslo"}'}),
    Event(
        TOOL_DONE_EVENT, {"call_id": "call_1", "name": "weather", "arguments": '{"city": "Oslo"}'}
    ),
]


def test_a_streamed_text_answer() -> None:
    chat = answer(stream=True, stream_options={"include_usage": True})
    finish = Event(
        FINISH_EVENT, {"finish_reason": "length", "prompt_tokens": 5, "completion_tokens": 2}
    )
    chunks = streamed(chat, [TextDelta("Hel"), TextDelta("lo"), finish])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:3]] == ["Hel", "lo"]
    assert chunks[3]["choices"][0]["finish_reason"] == "length"
    assert chunks[4]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert {c["id"] for c in chunks} == {chat.id}


def test_a_streamed_tool_call() -> None:
    chunks = streamed(answer(stream=True), TOOL_ITEMS)
    started = chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert (started["id"], started["function"]) == ("call_1", {"name": "weather", "arguments": ""})
    pieces = [
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[2:4]
    ]
    assert "".join(pieces) == '{"city": "Oslo"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # no llm.finish: inferred
    assert len(chunks) == 5  # the call's end adds no chunk


def test_streamed_audio_is_resampled_to_the_output_rate() -> None:
    chat = answer(stream=True, modalities=["text", "audio"], audio={"voice": "default"})
    chunks = streamed(chat, [TextDelta("hi"), AudioChunk(b"\x01\x00" * 160, 16000)])
    assert chunks[0]["choices"][0]["delta"]["content"] is None
    assert chunks[1]["choices"][0]["delta"]["audio"] == {"id": chat.audio_id, "transcript": "hi"}
    pcm = base64.b64decode(chunks[2]["choices"][0]["delta"]["audio"]["data"])
    assert len(pcm) == 2 * 240  # 10 ms at 24 kHz


def test_a_whole_answer_with_a_call() -> None:
    chat = answer()
    for item in [TextDelta("Let me look."), *TOOL_ITEMS]:
        chat.keep(item)
    body = ChatCompletion.model_validate_json(chat.body())
    message = body.choices[0].message
    assert message.content == "Let me look."
    assert message.tool_calls is not None
    [call] = json.loads(chat.body())["choices"][0]["message"]["tool_calls"]
    assert call == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
    }
    assert body.choices[0].finish_reason == "tool_calls"
    assert body.usage is not None
    assert body.usage.completion_tokens == 1


def test_a_whole_audio_answer_in_wav() -> None:
    chat = answer(modalities=["text", "audio"], audio={"voice": "default", "format": "wav"})
    for item in [TextDelta("hi"), AudioChunk(b"\x01\x00" * 480, RATE_HZ)]:
        chat.keep(item)
    body = ChatCompletion.model_validate_json(chat.body())
    message = body.choices[0].message
    assert message.content is None
    assert message.audio is not None
    assert message.audio.transcript == "hi"
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as wav:
        assert (wav.getframerate(), wav.getnframes()) == (RATE_HZ, 480)
