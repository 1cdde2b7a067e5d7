"""The sans-io Realtime protocol (omnitrio.realtime): frames in, server events out, no sockets."""

from __future__ import annotations

import base64
import json
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel

from omnitrio import AudioChunk, Event, ResponseOptions, TextDelta
from omnitrio.realtime import (
    JSON_SUBPROTOCOL,
    MSGPACK_SUBPROTOCOL,
    CancelResponse,
    Dialect,
    Framing,
    LocalProtocolError,
    RealtimeSession,
    ServerEvent,
    SessionConfig,
    StartResponse,
    select_subprotocol,
)

REPO = Path(__file__).resolve().parents[2]
RATE_HZ = 24000
Out = list[ServerEvent | StartResponse | CancelResponse]


def pcm(num_samples: int, value: int = 1000) -> bytes:
    return value.to_bytes(2, "little", signed=True) * num_samples


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def open_session(
    framing: Framing = "json", dialect: Dialect = "ga", **limits: Any
) -> RealtimeSession:
    session = RealtimeSession(
        SessionConfig("sess_test", "synthetic-omni", framing, dialect, **limits)
    )
    session.start()
    return session


def send(session: RealtimeSession, event: Mapping[str, Any]) -> Out:
    if session.config.framing == "msgpack":
        return session.receive(msgpack.packb(event, use_bin_type=True))
    return session.receive(json.dumps(event))


def wire(session: RealtimeSession, event: ServerEvent) -> dict[str, Any]:
    """What the client receives for ``event``, decoded."""
    data = session.encode(event)
    if session.config.framing == "msgpack":
        assert isinstance(data, bytes)
        decoded: dict[str, Any] = msgpack.unpackb(data, raw=False)
    else:
        assert isinstance(data, str)
        decoded = json.loads(data)
    return decoded


def names(out: Iterable[object]) -> list[str]:
    return [o.type if isinstance(o, ServerEvent) else type(o).__name__ for o in out]


def only_error(out: Out) -> dict[str, Any]:
    assert names(out) == ["error"], names(out)
    event = out[0]
    assert isinstance(event, ServerEvent)
    error = dict(event.fields["error"])  # type: ignore[arg-type]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    return error


def field_error(out: Out) -> dict[str, Any]:
    """The one error of a session.update refused field by field (the rest applied)."""
    assert names(out)[-1:] == ["session.updated"], names(out)
    return only_error(out[:-1])


def user_text(text: str, **extra: Any) -> dict[str, Any]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item, **extra}


def start_response(session: RealtimeSession, **params: Any) -> StartResponse:
    event: dict[str, Any] = {"type": "response.create"}
    if params:
        event["response"] = params
    out = send(session, event)
    assert names(out) == ["response.created", "StartResponse"]
    start = out[1]
    assert isinstance(start, StartResponse)
    assert session.active_response_id == start.response_id
    return start


def text_turn(session: RealtimeSession, text: str = "hello") -> list[ServerEvent]:
    """A whole text turn; returns every server event of the response."""
    send(session, user_text(text))
    start = start_response(session)
    events = session.output(start.response_id, TextDelta("Hi"))
    events += session.finish(start.response_id, "completed")
    return events


# --- turns ----------------------------------------------------------------------------------


def test_session_created_states_the_session() -> None:
    session = RealtimeSession(SessionConfig("sess_1", "synthetic-omni"))
    [created] = session.start()
    message = wire(session, created)
    assert message["type"] == "session.created"
    assert message["event_id"].startswith("event_")
    assert message["session"]["id"] == "sess_1"
    assert message["session"]["model"] == "synthetic-omni"
    assert message["session"]["output_modalities"] == ["audio"]
    assert message["session"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert message["session"]["audio"]["input"]["turn_detection"] is None


def test_text_turn() -> None:
    session = open_session()
    update = {"output_modalities": ["text"], "instructions": "be brief"}
    out = send(session, {"type": "session.update", "session": {"type": "realtime", **update}})
    assert names(out) == ["session.updated"]
    assert wire(session, out[0])["session"]["instructions"] == "be brief"  # type: ignore[arg-type]

    out = send(session, user_text("hello"))
    assert names(out) == ["conversation.item.added", "conversation.item.done"]
    user_item_id = wire(session, out[0])["item"]["id"]  # type: ignore[arg-type]

    start = start_response(session)
    assert start.request.text == "user: hello"
    assert start.request.audio is None
    assert start.request.options == ResponseOptions(modalities=("text",), instructions="be brief")

    rid = start.response_id
    first = session.output(rid, TextDelta("Hi"))
    assert names(first) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert session.output(rid, AudioChunk(pcm(240), RATE_HZ)) == []  # text only: not shown
    assert names(session.output(rid, TextDelta(" there"))) == ["response.output_text.delta"]
    done = session.finish(rid, "completed")
    assert names(done) == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert session.active_response_id is None
    messages = [wire(session, e) for e in first + done]
    assert messages[1]["previous_item_id"] == user_item_id
    assert messages[-5]["text"] == "Hi there"
    response = messages[-1]["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["content"] == [{"type": "output_text", "text": "Hi there"}]
    assert response["usage"] == {
        "total_tokens": 11 + 8 + 2,
        "input_tokens": 11 + 8,  # UTF-8 bytes of "user: hello" and of the instructions
        "output_tokens": 2,  # text deltas
        "input_token_details": {"text_tokens": 19, "audio_tokens": 0, "cached_tokens": 0},
        "output_token_details": {"text_tokens": 2, "audio_tokens": 0},
    }

    # The next turn's request carries the whole conversation.
    send(session, user_text("and now?"))
    assert (
        start_response(session).request.text == "user: hello\nassistant: Hi there\nuser: and now?"
    )


def test_audio_turn() -> None:
    session = open_session()
    for chunk in (pcm(12000, 1), pcm(12000, 2)):
        assert send(session, {"type": "input_audio_buffer.append", "audio": b64(chunk)}) == []
    assert session.statistics().input_audio_buffered_s == 1.0
    out = send(session, {"type": "input_audio_buffer.commit"})
    assert names(out) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    committed = wire(session, out[0])  # type: ignore[arg-type]
    item = wire(session, out[1])["item"]  # type: ignore[arg-type]
    assert committed["item_id"] == item["id"]
    assert item["content"] == [{"type": "input_audio", "transcript": None}]
    assert session.statistics().input_audio_committed_s == 1.0

    start = start_response(session, max_output_tokens=200, audio={"output": {"voice": "marin"}})
    assert start.request.audio is not None
    assert start.request.audio.pcm16 == pcm(12000, 1) + pcm(12000, 2)
    assert start.request.audio.sample_rate_hz == RATE_HZ
    assert start.request.text == ""  # no transcript of the audio yet
    assert start.request.options == ResponseOptions(
        modalities=("audio",), voice="marin", max_tokens=200
    )
    assert session.statistics().input_audio_committed_s == 0.0  # handed to the response

    rid = start.response_id
    events = session.output(rid, AudioChunk(pcm(2400), RATE_HZ))
    events += session.output(rid, TextDelta("Hel"))
    events += session.output(rid, Event("trace", {"stage": "talker"}))  # not shown
    events += session.output(rid, AudioChunk(pcm(2400), RATE_HZ))
    events += session.output(rid, TextDelta("lo"))
    events += session.finish(rid, "completed")
    assert names(events) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert events[3].audio == pcm(2400)
    messages = [wire(session, e) for e in events]
    assert base64.b64decode(messages[3]["delta"]) == pcm(2400)
    assert messages[2]["part"] == {"type": "audio", "transcript": ""}
    assert messages[8]["transcript"] == "Hello"
    usage = messages[-1]["response"]["usage"]
    assert usage["input_token_details"]["audio_tokens"] == 10  # 1 s, one token per 100 ms
    assert usage["output_token_details"] == {"text_tokens": 2, "audio_tokens": 2}
    assert messages[-1]["response"]["audio"]["output"]["voice"] == "marin"


def test_transcript_event_becomes_the_input_transcription() -> None:
    session = open_session(transcription_model="WhisperAsr")
    send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(4800))})
    item_id = wire(session, send(session, {"type": "input_audio_buffer.commit"})[0])["item_id"]  # type: ignore[arg-type]
    start = start_response(session)
    [event] = session.output(start.response_id, Event("transcript", {"text": "what time is it"}))
    message = wire(session, event)
    assert message["type"] == "conversation.item.input_audio_transcription.completed"
    assert message["item_id"] == item_id
    assert message["transcript"] == "what time is it"
    assert message["usage"] == {"type": "duration", "seconds": 0.2}
    session.output(start.response_id, TextDelta("noon"))
    session.finish(start.response_id, "completed")
    send(session, user_text("thanks"))
    text = start_response(session).request.text
    assert text == "user: what time is it\nassistant: noon\nuser: thanks"


def test_cancel() -> None:
    session = open_session()
    send(session, user_text("tell me a story"))
    rid = start_response(session).response_id
    session.output(rid, TextDelta("Once"))
    out = send(session, {"type": "response.cancel"})
    assert out == [CancelResponse(rid)]
    assert session.statistics().response_state == "CANCELLING"
    assert session.output(rid, TextDelta(" upon")) == []  # no deltas after a cancel
    assert send(session, {"type": "response.cancel", "response_id": rid}) == []  # under way
    refused = only_error(send(session, {"type": "response.create"}))
    assert refused["code"] == "conversation_already_has_active_response"
    done = session.finish(rid, "completed")  # the stream may end before the cancel lands
    assert names(done)[-1] == "response.done"
    response = wire(session, done[-1])["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert response["output"][0]["status"] == "incomplete"
    assert wire(session, done[1])["transcript"] == "Once"
    assert session.active_response_id is None

    error = only_error(send(session, {"type": "response.cancel", "event_id": "c1"}))
    assert error["code"] == "response_cancel_not_active"
    assert error["event_id"] == "c1"
    rid = start_response(session).response_id
    error = only_error(send(session, {"type": "response.cancel", "response_id": "resp_other"}))
    assert error["code"] == "response_cancel_not_active"
    assert session.active_response_id == rid


def test_response_with_no_output_and_failure() -> None:
    session = open_session()
    rid = start_response(session).response_id
    [done] = session.finish(rid, "failed", error="stage 'talker' failed")
    response = wire(session, done)["response"]
    assert response["status"] == "failed"
    assert response["output"] == []
    assert response["status_details"]["error"]["message"] == "stage 'talker' failed"


def test_response_create_is_refused_while_a_response_is_active() -> None:
    session = open_session()
    rid = start_response(session).response_id
    error = only_error(send(session, {"type": "response.create", "event_id": "e9"}))
    assert error["code"] == "conversation_already_has_active_response"
    assert error["event_id"] == "e9"
    assert session.active_response_id == rid
    session.finish(rid, "completed")
    start_response(session)


def test_response_create_overrides_apply_to_that_response_only() -> None:
    session = open_session()
    start = start_response(
        session, output_modalities=["text"], instructions="shout", metadata={"turn": "1"}
    )
    assert start.request.options.modalities == ("text",)
    assert start.request.options.instructions == "shout"
    events = session.finish(start.response_id, "completed")
    assert wire(session, events[-1])["response"]["metadata"] == {"turn": "1"}
    assert start_response(session).request.options.modalities == ("audio",)


def test_conversation_items_in_place() -> None:
    session = open_session()
    send(session, user_text("second", event_id="a"))
    out = send(session, {**user_text("first"), "previous_item_id": "root"})
    assert wire(session, out[0])["previous_item_id"] is None  # type: ignore[arg-type]
    assistant = {"type": "message", "role": "assistant", "id": "item_mine"}
    assistant["content"] = [{"type": "output_text", "text": "noted"}]
    send(session, {"type": "conversation.item.create", "item": assistant})
    duplicate = only_error(send(session, {"type": "conversation.item.create", "item": assistant}))
    assert duplicate["code"] == "duplicate_item_id"
    missing = only_error(send(session, {**user_text("x"), "previous_item_id": "item_nope"}))
    assert missing["code"] == "item_not_found"
    assert start_response(session).request.text == "user: first\nuser: second\nassistant: noted"


# --- bad input ------------------------------------------------------------------------------

APPEND = "input_audio_buffer.append"
BAD_EVENTS: list[tuple[str, object, str]] = [
    ("not an object", [1, 2], "invalid_event"),
    ("no type", {"event_id": "x"}, "invalid_event"),
    ("type not a string", {"type": 5}, "invalid_event"),
    ("unknown type", {"type": "session.explode"}, "unknown_event_type"),
    ("delete", {"type": "conversation.item.delete", "item_id": "i"}, "item_not_found"),
    ("retrieve", {"type": "conversation.item.retrieve", "item_id": "i"}, "item_not_found"),
    ("truncate", {"type": "conversation.item.truncate"}, "missing_required_parameter"),
    ("output clear", {"type": "output_audio_buffer.clear"}, "unsupported_event_type"),
    ("transcription", {"type": "transcription_session.update"}, "unsupported_event_type"),
    ("event_id type", {"type": "input_audio_buffer.clear", "event_id": 3}, "invalid_type"),
    ("session missing", {"type": "session.update"}, "missing_required_parameter"),
    ("session type", {"type": "session.update", "session": "fast"}, "invalid_type"),
    (
        "instructions type",
        {"type": "session.update", "session": {"instructions": 1}},
        "invalid_type",
    ),
    (
        "unknown param",
        {"type": "session.update", "session": {"colour": "red"}},
        "unknown_parameter",
    ),
    ("top-level extra", {"type": "input_audio_buffer.commit", "now": True}, "unknown_parameter"),
    (
        "modalities",
        {"type": "session.update", "session": {"output_modalities": ["video"]}},
        "invalid_value",
    ),
    (
        "no modality",
        {"type": "session.update", "session": {"output_modalities": []}},
        "invalid_value",
    ),
    (
        "vad",
        {
            "type": "session.update",
            "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
        },
        "unsupported_parameter",
    ),
    (
        "pcmu",
        {
            "type": "session.update",
            "session": {"audio": {"output": {"format": {"type": "audio/pcmu"}}}},
        },
        "unsupported_parameter",
    ),
    (
        "rate",
        {
            "type": "session.update",
            "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        },
        "unsupported_parameter",
    ),
    (
        "tools",
        {"type": "session.update", "session": {"tools": [{"type": "function", "name": 3}]}},
        "invalid_type",
    ),
    (
        "tool choice names no tool",
        {"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "f"}}},
        "invalid_value",
    ),
    (
        "tool parameters not a schema",
        {"type": "session.update", "session": {"tools": [{"name": "f", "parameters": "x"}]}},
        "invalid_type",
    ),
    (
        "output of no call",
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_x", "output": "{}"},
        },
        "invalid_value",
    ),
    (
        "output not a string",
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_x", "output": {"a": 1}},
        },
        "invalid_type",
    ),
    (
        "transcription session",
        {"type": "session.update", "session": {"type": "transcription"}},
        "unsupported_parameter",
    ),
    (
        "max tokens",
        {"type": "session.update", "session": {"max_output_tokens": 0}},
        "invalid_value",
    ),
    ("temperature", {"type": "session.update", "session": {"temperature": "hot"}}, "invalid_type"),
    ("audio missing", {"type": APPEND}, "missing_required_parameter"),
    ("audio type", {"type": APPEND, "audio": 12}, "invalid_type"),
    ("bad base64", {"type": APPEND, "audio": "not base64!"}, "invalid_base64"),
    ("half sample", {"type": APPEND, "audio": b64(b"\x01\x02\x03")}, "invalid_value"),
    ("commit empty", {"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
    (
        "function call",
        {"type": "conversation.item.create", "item": {"type": "function_call"}},
        "missing_required_parameter",
    ),
    (
        "item audio",
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": ""}],
            },
        },
        "unsupported_parameter",
    ),
    (
        "item role",
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "robot", "content": []},
        },
        "invalid_value",
    ),
    (
        "item no content",
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user"}},
        "missing_required_parameter",
    ),
    (
        "item text type",
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": None}],
            },
        },
        "missing_required_parameter",
    ),
    (
        "out of band",
        {"type": "response.create", "response": {"conversation": "none"}},
        "unsupported_parameter",
    ),
    (
        "response input",
        {"type": "response.create", "response": {"input": []}},
        "unsupported_parameter",
    ),
    ("response params", {"type": "response.create", "response": [1]}, "invalid_type"),
    ("metadata", {"type": "response.create", "response": {"metadata": {"k": 1}}}, "invalid_type"),
    ("cancel idle", {"type": "response.cancel"}, "response_cancel_not_active"),
]


@pytest.mark.parametrize(("case", "event", "code"), BAD_EVENTS, ids=[c[0] for c in BAD_EVENTS])
def test_bad_event_gives_an_error_and_the_session_goes_on(
    case: str, event: object, code: str
) -> None:
    session = open_session()
    if code != "input_audio_buffer_commit_empty":  # some audio held, to see it is kept
        send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(100))})
    before = session.statistics()
    with_id = (
        {**event, "event_id": event.get("event_id", "evt_1")} if isinstance(event, dict) else event
    )
    out = session.receive(json.dumps(with_id))
    if names(out)[-1:] == ["session.updated"]:  # refused field by field; the rest applies
        out = out[:-1]
    error = only_error(out)
    assert error["code"] == code
    if isinstance(event, dict) and "event_id" not in event:
        assert error["event_id"] == "evt_1"
    after = session.statistics()
    assert after.num_errors == before.num_errors + 1
    assert (after.input_audio_buffered_s, after.num_items) == (
        before.input_audio_buffered_s,
        before.num_items,
    )
    assert names(text_turn(session))[-1] == "response.done"


BAD_FRAMES: list[tuple[str, str | bytes, str]] = [
    ("malformed json", '{"type": "response.create"', "invalid_json"),
    ("empty frame", "", "invalid_json"),
    ("NaN", '{"type": "session.update", "session": {"temperature": NaN}}', "invalid_json"),
    ("deep nesting", "[" * 100_000 + "]" * 100_000, "message_too_large"),
    ("recursion", "[" * 20_000 + "]" * 20_000, "invalid_json"),
    ("huge int", '{"type": "x", "n": ' + "9" * 5000 + "}", "invalid_json"),
    ("binary frame", b'{"type": "response.create"}', "wrong_frame_type"),
    ("oversized", json.dumps({"type": APPEND, "audio": "A" * 200_000}), "message_too_large"),
    ("lone surrogate", json.dumps(user_text("\ud800")), "invalid_value"),
]


@pytest.mark.parametrize(("case", "frame", "code"), BAD_FRAMES, ids=[c[0] for c in BAD_FRAMES])
def test_bad_frame_gives_an_error_and_the_session_goes_on(
    case: str, frame: str | bytes, code: str
) -> None:
    session = open_session(max_message_bytes=100_000)
    assert only_error(session.receive(frame))["code"] == code
    assert names(text_turn(session))[-1] == "response.done"


def test_input_audio_is_bounded() -> None:
    session = open_session(max_input_audio_s=1.0)
    send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(16000))})
    send(session, {"type": "input_audio_buffer.commit"})  # committed audio still counts
    error = only_error(
        send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(9000))})
    )
    assert error["code"] == "input_audio_buffer_full"
    assert session.statistics().input_audio_buffered_s == 0.0
    assert send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(8000))}) == []
    assert names(send(session, {"type": "input_audio_buffer.clear"})) == [
        "input_audio_buffer.cleared"
    ]
    assert session.statistics().input_audio_buffered_s == 0.0
    start_response(session)  # hands the committed second over: room again
    assert send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(24000))}) == []


def test_session_update_refuses_field_by_field() -> None:
    session = open_session()
    bad = {
        "instructions": "new",
        "colour": "red",
        "audio": {"output": {"format": {"type": "audio/pcma"}, "voice": "marin"}},
    }
    out = send(session, {"type": "session.update", "session": bad})
    assert names(out) == ["error", "error", "session.updated"]
    errors = [only_error(out[i : i + 1]) for i in (0, 1)]
    assert [e["param"] for e in errors] == ["session.audio.output.format.type", "session.colour"]
    assert "audio/pcm" in errors[0]["message"]
    assert errors[1]["code"] == "unknown_parameter"
    options = start_response(session).request.options
    assert (options.instructions, options.voice) == ("new", "marin")  # the rest applied


def test_tool_choice_required_before_the_tools_is_kept_until_a_response() -> None:
    session = open_session()
    assert names(send(session, {"type": "session.update", "session": {"tool_choice": "required"}}))[
        -1:
    ] == ["session.updated"]
    error = only_error(send(session, {"type": "response.create"}))
    assert error["param"] == "tool_choice"
    assert "no tools" in error["message"]
    assert "send tools" in error["message"]
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
    send(session, {"type": "session.update", "session": {"tools": [tool]}})
    assert start_response(session).request.options.tool_choice.mode == "required"


def test_input_transcription_on_off_and_the_stage_model() -> None:
    session = open_session(transcription_model="WhisperAsr")
    asked = {"audio": {"input": {"transcription": {"model": "gpt-4o-mini-transcribe"}}}}
    [updated] = send(session, {"type": "session.update", "session": asked})
    shown = wire(session, updated)["session"]["audio"]["input"]["transcription"]  # type: ignore[index]
    assert shown["model"] == "WhisperAsr"
    off = {"audio": {"input": {"transcription": None}}}
    send(session, {"type": "session.update", "session": off})
    send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(4800))})
    send(session, {"type": "input_audio_buffer.commit"})
    start = start_response(session)
    assert session.output(start.response_id, Event("transcript", {"text": "hi"})) == []
    no_asr = open_session()
    out = send(no_asr, {"type": "session.update", "session": asked})
    assert only_error(out[:1])["param"] == "session.audio.input.transcription"


def test_session_update_accepts_what_asks_for_nothing() -> None:
    session = open_session()
    accepted = {
        "type": "realtime",
        "model": "gpt-realtime",
        "output_modalities": ["audio", "text"],
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcm"}, "voice": {"id": "voice_1"}, "speed": 1.0},
        },
        "tools": [],
        "tool_choice": "auto",
        "tracing": None,
        "temperature": 0.7,
        "max_output_tokens": "inf",
    }
    assert names(send(session, {"type": "session.update", "session": accepted})) == [
        "session.updated"
    ]
    options = start_response(session).request.options
    assert options == ResponseOptions(
        modalities=("text", "audio"), voice="voice_1", temperature=0.7
    )


def test_misuse_by_the_server_raises() -> None:
    session = RealtimeSession(SessionConfig("sess_x", "m"))
    with pytest.raises(LocalProtocolError, match="start"):
        session.receive("{}")
    session.start()
    with pytest.raises(LocalProtocolError):
        session.start()
    with pytest.raises(LocalProtocolError, match="active response is None"):
        session.output("resp_1", TextDelta("x"))
    rid = start_response(session).response_id
    with pytest.raises(LocalProtocolError, match="resample"):
        session.output(rid, AudioChunk(pcm(10), 16000))
    with pytest.raises(LocalProtocolError, match="status"):
        session.finish(rid, "done")  # type: ignore[arg-type]
    session.finish(rid, "completed")
    with pytest.raises(LocalProtocolError):
        session.finish(rid, "completed")


# --- framing and dialects -------------------------------------------------------------------


def test_msgpack_round_trip_with_raw_audio() -> None:
    session = open_session(framing="msgpack")
    assert send(session, {"type": APPEND, "audio": pcm(2400, 7)}) == []  # raw bytes
    assert send(session, {"type": APPEND, "audio": b64(pcm(2400, 8))}) == []  # base64 also works
    send(session, {"type": "input_audio_buffer.commit"})
    start = start_response(session)
    assert start.request.audio is not None
    assert start.request.audio.pcm16 == pcm(2400, 7) + pcm(2400, 8)
    events = session.output(start.response_id, AudioChunk(pcm(480, -3), RATE_HZ))
    data = session.encode(events[-1])
    assert isinstance(data, bytes)
    message = msgpack.unpackb(data, raw=False)
    assert message["type"] == "response.output_audio.delta"
    assert message["delta"] == pcm(480, -3)  # raw PCM, no base64
    assert message["response_id"] == start.response_id
    error = only_error(session.receive('{"type": "response.cancel"}'))
    assert error["code"] == "wrong_frame_type"
    assert only_error(session.receive(b"\xc1garbage"))["code"] == "invalid_msgpack"
    assert isinstance(msgpack.unpackb(session.encode(error_event_of(session)), raw=False), dict)


def error_event_of(session: RealtimeSession) -> ServerEvent:
    out = session.receive(msgpack.packb({"type": "nope"}))
    assert isinstance(out[0], ServerEvent)
    return out[0]


def test_beta_dialect_names_and_session_shape() -> None:
    session = RealtimeSession(SessionConfig("sess_b", "synthetic-omni", dialect="beta"))
    created = wire(session, session.start()[0])["session"]
    assert created["modalities"] == ["text", "audio"]
    assert created["input_audio_format"] == "pcm16"
    assert "model" not in created  # the beta SDK only knows OpenAI's model names
    update = {
        "modalities": ["text"],
        "voice": "alloy",
        "input_audio_format": "pcm16",
        "turn_detection": None,
        "temperature": 0.8,
        "max_response_output_tokens": 50,
    }
    assert names(send(session, {"type": "session.update", "session": update})) == [
        "session.updated"
    ]
    error = field_error(
        send(session, {"type": "session.update", "session": {"output_modalities": ["text"]}})
    )
    assert (error["code"], error["param"]) == ("unknown_parameter", "session.output_modalities")
    error = field_error(
        send(session, {"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}})
    )
    assert error["code"] == "unsupported_parameter"
    out = send(session, user_text("hi"))
    assert names(out) == ["conversation.item.created"]
    start = start_response(session)
    assert start.request.options == ResponseOptions(
        modalities=("text",), voice="alloy", temperature=0.8, max_tokens=50
    )
    events = session.output(start.response_id, TextDelta("yo"))
    events += session.finish(start.response_id, "completed")
    assert names(events) == [
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.text.delta",
        "response.text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert wire(session, events[-1])["response"]["output"][0]["content"] == [
        {"type": "text", "text": "yo"}
    ]


def test_select_subprotocol() -> None:
    assert select_subprotocol([]) == ("json", None)
    assert select_subprotocol(["openai-insecure-api-key.k", "realtime"]) == ("json", "realtime")
    assert select_subprotocol([MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL]) == (
        "msgpack",
        MSGPACK_SUBPROTOCOL,
    )
    assert select_subprotocol(["x", JSON_SUBPROTOCOL, MSGPACK_SUBPROTOCOL]) == (
        "json",
        JSON_SUBPROTOCOL,
    )


# --- the SDK parses every event we send -----------------------------------------------------

EMITTED_GA = {
    "session.created",
    "session.updated",
    "input_audio_buffer.committed",
    "input_audio_buffer.cleared",
    "conversation.item.added",
    "conversation.item.done",
    "conversation.item.input_audio_transcription.completed",
    "response.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.delta",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.done",
    "conversation.item.truncated",
    "conversation.item.deleted",
    "conversation.item.retrieved",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "error",
}
BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}
EMITTED_BETA = {BETA_NAMES.get(name, name) for name in EMITTED_GA} - {None}
# Fields we send that the SDK's models do not declare (pydantic keeps them as extras).
ALLOWED_EXTRAS = {"ga": {"session.id", "session.object"}, "beta": {"session.object"}}


def _models_by_type(union: object) -> dict[str, type[BaseModel]]:
    members = typing.get_args(typing.get_args(union)[0])
    models: dict[str, type[BaseModel]] = {}
    for model in members:
        [literal] = typing.get_args(model.model_fields["type"].annotation)
        models[literal] = model
    return models


def _extras(value: object, path: str) -> set[str]:
    found: set[str] = set()
    if isinstance(value, BaseModel):
        found |= {f"{path}.{key}".lstrip(".") for key in value.model_extra or {}}
        for name in type(value).model_fields:
            found |= _extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for inner in value:
            found |= _extras(inner, path)
    return found


def every_kind_of_event(session: RealtimeSession) -> list[ServerEvent]:
    """A session that makes every server event omnitrio sends at least once."""
    events: list[object] = list(session.start())
    events += send(session, {"type": "session.update", "session": {"instructions": "hi"}})
    events += send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(4800))})
    events += send(session, {"type": "input_audio_buffer.commit"})
    events += send(session, {"type": "input_audio_buffer.clear"})
    events += send(session, {"type": "response.nope"})
    for modality in ("audio", "text"):
        params = {
            "modalities" if session.config.dialect == "beta" else "output_modalities": [modality]
        }
        events += send(session, user_text("hello"))
        events += send(
            session, {"type": "response.create", "response": {**params, "metadata": {"a": "b"}}}
        )
        rid = session.active_response_id
        assert rid is not None
        events += session.output(rid, Event("transcript", {"text": "hi there"}))
        events += session.output(rid, TextDelta("Hi"))
        events += session.output(rid, AudioChunk(pcm(2400), RATE_HZ))
        events += session.finish(rid, "completed")
        if modality == "audio":
            item_id = _output_item_id(events)
            truncate = {"type": "conversation.item.truncate", "item_id": item_id}
            events += send(session, {**truncate, "content_index": 0, "audio_end_ms": 50})
            events += send(session, {"type": "conversation.item.retrieve", "item_id": item_id})
            events += send(session, {"type": "conversation.item.delete", "item_id": item_id})
    events += function_call_turn(session)
    for status in ("cancelled", "failed", "incomplete"):
        rid = start_response(session).response_id
        events += session.output(rid, TextDelta("partial"))
        if status == "cancelled":
            events += send(session, {"type": "response.cancel"})
        events += session.finish(rid, status, "boom")  # type: ignore[arg-type]
    return [e for e in events if isinstance(e, ServerEvent)]


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def function_call_turn(session: RealtimeSession) -> list[ServerEvent]:
    """A turn where the model calls get_weather, the client answers, the model speaks."""
    events: list[object] = []
    events += send(session, {"type": "session.update", "session": {"tools": [WEATHER_TOOL]}})
    events += send(session, user_text("weather in Paris?"))
    rid = start_response(session, tool_choice="required").response_id
    call = {"call_id": "call_1"}
    events += session.output(rid, Event("tool_call", {**call, "name": "get_weather"}))
    events += session.output(rid, Event("tool_call.arguments", {**call, "delta": '{"city": '}))
    events += session.output(rid, Event("tool_call.arguments", {**call, "delta": '"Paris"}'}))
    done = {**call, "name": "get_weather", "arguments": '{"city": "Paris"}'}
    events += session.output(rid, Event("tool_call.done", done))
    events += session.finish(rid, "completed")
    output = {"type": "function_call_output", "call_id": "call_1", "output": '{"sky": "sunny"}'}
    events += send(session, {"type": "conversation.item.create", "item": output})
    start = start_response(session)
    assert start.request.text.splitlines()[-2:] == [
        'assistant: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        'tool: {"sky": "sunny"}',
    ]
    assert start.request.options.tools
    events += session.finish(start.response_id, "completed")
    return [e for e in events if isinstance(e, ServerEvent)]


def test_function_call_turn() -> None:
    session = open_session()
    events = function_call_turn(session)
    kinds = names(events)
    first = kinds.index("response.output_item.added")
    assert kinds[first : first + 8] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    done = next(e for e in events if e.type == "response.done").fields["response"]
    assert isinstance(done, Mapping)
    (item,) = done["output"]
    assert isinstance(item, Mapping)
    assert (item["type"], item["name"], item["arguments"]) == (
        "function_call",
        "get_weather",
        '{"city": "Paris"}',
    )
    updated = next(e for e in events if e.type == "session.updated").fields["session"]
    assert isinstance(updated, Mapping)
    assert updated["tools"] == (WEATHER_TOOL,)


def _output_item_id(events: list[object]) -> str:
    done = [
        e for e in events if isinstance(e, ServerEvent) and e.type == "response.output_item.done"
    ]
    item = done[-1].fields["item"]
    assert isinstance(item, Mapping)
    return str(item["id"])


@pytest.mark.parametrize("framing", ["json", "msgpack"])
@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_the_sdk_parses_every_event_we_send(dialect: Dialect, framing: Framing) -> None:
    union = RealtimeServerEvent if dialect == "ga" else BetaServerEvent
    models = _models_by_type(union)
    config = SessionConfig("sess_sdk", "synthetic-omni", framing, dialect, transcription_model="A")
    session = RealtimeSession(config)
    events = every_kind_of_event(session)
    assert {e.type for e in events} == (EMITTED_GA if dialect == "ga" else EMITTED_BETA)
    for event in events:
        message = wire(session, event)
        if isinstance(message.get("delta"), bytes):  # msgpack audio: the JSON client sees base64
            message["delta"] = b64(message["delta"])
        parsed = models[message["type"]].model_validate(message)
        assert _extras(parsed, "") <= ALLOWED_EXTRAS[dialect], message["type"]


# --- truncate and delete ------------------------------------------------------------------


def _spoken_answer(session: RealtimeSession, text: str, audio_ms: int) -> str:
    """A finished audio answer saying ``text`` over ``audio_ms``; returns its item id."""
    send(session, user_text("hello"))
    rid = start_response(session, output_modalities=["audio"]).response_id
    events = session.output(rid, TextDelta(text))
    events += session.output(rid, AudioChunk(pcm(RATE_HZ * audio_ms // 1000), RATE_HZ))
    events += session.finish(rid, "completed")
    return _output_item_id(list(events))


def truncate(item_id: str, audio_end_ms: object, **extra: object) -> dict[str, object]:
    return {
        "type": "conversation.item.truncate",
        "item_id": item_id,
        "content_index": 0,
        "audio_end_ms": audio_end_ms,
        **extra,
    }


def test_truncate_cuts_the_transcript_to_what_was_played() -> None:
    session = open_session()
    item_id = _spoken_answer(session, "one two three four five six seven eight", 4000)
    out = send(session, truncate(item_id, 1000))  # a quarter of the audio was heard
    assert names(out) == ["conversation.item.truncated"]
    assert dict(out[0].fields) == {"item_id": item_id, "content_index": 0, "audio_end_ms": 1000}
    start = start_response(session)
    assert start.request.text.splitlines()[1] == "assistant: one two"
    session.finish(start.response_id, "completed")
    # Past the (now shorter) audio, a user item, an unknown item: refused, nothing changes.
    assert only_error(send(session, truncate(item_id, 1500)))["param"] == "audio_end_ms"
    assert only_error(send(session, truncate("nope", 0)))["code"] == "item_not_found"
    assert only_error(send(session, truncate(item_id, -1)))["code"] == "invalid_value"
    assert only_error(send(session, truncate(item_id, 0, content_index=1)))["code"] == (
        "invalid_value"
    )


def test_truncate_during_the_answer_applies_when_it_closes() -> None:
    """Barge-in: the client cancels, then truncates to its playback position before
    response.done arrives; the conversation keeps only what was heard."""
    session = open_session()
    send(session, user_text("hello"))
    rid = start_response(session, output_modalities=["audio"]).response_id
    added = session.output(rid, TextDelta("the quick brown fox jumps over the lazy dog"))
    item = next(e for e in added if e.type == "response.output_item.added").fields["item"]
    assert isinstance(item, Mapping)
    session.output(rid, AudioChunk(pcm(RATE_HZ * 2), RATE_HZ))
    assert names(send(session, {"type": "response.cancel"})) == ["CancelResponse"]
    assert only_error(send(session, truncate(str(item["id"]), 2500)))["param"] == "audio_end_ms"
    assert names(send(session, truncate(str(item["id"]), 1000))) == ["conversation.item.truncated"]
    done = session.finish(rid, "cancelled")
    transcript = next(e for e in done if e.type == "response.output_audio_transcript.done")
    assert transcript.fields["transcript"] == "the quick brown fox"  # the item as it stays
    start = start_response(session)
    assert start.request.text.splitlines()[1] == "assistant: the quick brown fox"


def test_retrieve_shows_an_item_as_the_conversation_holds_it() -> None:
    # The OpenAI Agents SDK retrieves items it is told of; its session.update sends
    # tracing "auto" (accepted: there is nothing to trace to).
    session = open_session()
    tracing = {"type": "session.update", "session": {"tracing": "auto"}}
    assert names(send(session, tracing)) == ["session.updated"]
    created = user_text("keep me")
    created["item"]["id"] = "item_kept"
    send(session, created)
    out = send(session, {"type": "conversation.item.retrieve", "item_id": "item_kept"})
    assert names(out) == ["conversation.item.retrieved"]
    shown = wire(session, out[0])["item"]
    assert shown == {**created["item"], "object": "realtime.item", "status": "completed"}, shown


def test_delete_removes_an_item_from_what_the_model_reads() -> None:
    session = open_session()
    send(session, user_text("keep me"))
    item = {
        "id": "item_drop",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "drop this"}],
    }
    send(session, {"type": "conversation.item.create", "item": item})
    before = session.statistics().num_items
    out = send(session, {"type": "conversation.item.delete", "item_id": "item_drop"})
    assert names(out) == ["conversation.item.deleted"]
    assert dict(out[0].fields) == {"item_id": "item_drop"}
    assert session.statistics().num_items == before - 1
    start = start_response(session)
    assert start.request.text == "user: keep me"
    session.finish(start.response_id, "completed")
    again = send(session, {"type": "conversation.item.delete", "item_id": "item_drop"})
    assert only_error(again)["code"] == "item_not_found"


# --- never raises on peer input -------------------------------------------------------------

KNOWN_TYPES = [
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "response.create",
    "response.cancel",
    "conversation.item.delete",
]
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
)
FIELD_NAMES = [
    "session",
    "audio",
    "item",
    "response",
    "event_id",
    "response_id",
    "content",
    "output_modalities",
    "modalities",
    "instructions",
    "role",
    "text",
    "previous_item_id",
]


def client_events(leaves: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    """Events of known types with a few fields of any shape (under the names we read)."""
    values = st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(FIELD_NAMES) | st.text(max_size=12), inner, max_size=3
            )
        ),
        max_leaves=6,
    )
    fields = st.dictionaries(st.sampled_from(FIELD_NAMES), values, max_size=3)
    return st.builds(
        lambda name, more: {"type": name, **more}, st.sampled_from(KNOWN_TYPES), fields
    )


json_events = client_events(SCALARS).map(json.dumps)
msgpack_events = client_events(SCALARS | st.binary(max_size=8)).map(
    lambda e: msgpack.packb(e, use_bin_type=True, unicode_errors="surrogatepass")
)
any_frame = st.one_of(st.text(max_size=64), st.binary(max_size=64), json_events, msgpack_events)
RESULT_TYPES = (ServerEvent, StartResponse, CancelResponse)
STATES = ["idle", "audio buffered", "response active", "cancelling"]


def session_in(state: str, framing: Framing = "json", dialect: Dialect = "ga") -> RealtimeSession:
    session = open_session(framing, dialect)
    if state != "idle":
        send(session, {"type": APPEND, "audio": b64(pcm(480))})
    if state in ("response active", "cancelling"):
        start_response(session)
    if state == "cancelling":
        send(session, {"type": "response.cancel"})
    return session


def receive_checked(session: RealtimeSession, frame: str | bytes) -> None:
    out = session.receive(frame)
    assert all(isinstance(o, RESULT_TYPES) for o in out)
    for o in out:
        if isinstance(o, ServerEvent):
            session.encode(o)


@settings(max_examples=2000, deadline=None, database=None)
@given(framing=st.sampled_from(["json", "msgpack"]), state=st.sampled_from(STATES), frame=any_frame)
def test_receive_never_raises(framing: Framing, state: str, frame: str | bytes) -> None:
    session = session_in(state, framing)
    receive_checked(session, frame)
    rid = session.active_response_id
    if rid is not None:
        for event in session.output(rid, TextDelta("x")) + session.finish(rid, "completed"):
            session.encode(event)
    assert names(text_turn(session))[-1] == "response.done"  # still usable


@settings(max_examples=200, deadline=None, database=None)
@given(dialect=st.sampled_from(["ga", "beta"]), frames=st.lists(json_events, max_size=5))
def test_event_sequences_never_raise(dialect: Dialect, frames: list[str]) -> None:
    session = session_in("idle", dialect=dialect)
    for frame in frames:
        receive_checked(session, frame)
        rid = session.active_response_id
        if rid is not None:
            session.output(rid, TextDelta("x"))
            session.finish(rid, "completed")


# --- the doc's example runs -----------------------------------------------------------------


def test_protocol_doc_snippets_run() -> None:
    path = REPO / "docs" / "protocol.md"
    source = path.read_text(encoding="utf-8")
    fence = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
    blocks = [(source.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in fence.finditer(source)]
    assert blocks
    namespace: dict[str, object] = {"__name__": "protocol_md"}
    for line, code in blocks:
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)


def test_the_conversation_is_bounded() -> None:
    config = SessionConfig(session_id="sess_1", model="m", max_conversation_bytes=2000)
    session = RealtimeSession(config)
    session.start()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "x" * 900}],
    }
    for _ in range(2):
        events = session.receive(json.dumps({"type": "conversation.item.create", "item": item}))
        assert all(e.type != "error" for e in events if isinstance(e, ServerEvent))
    (error,) = session.receive(json.dumps({"type": "conversation.item.create", "item": item}))
    assert isinstance(error, ServerEvent)
    assert error.type == "error"
    assert error.fields["error"]["code"] == "conversation_too_large"  # type: ignore[index]
    # The session goes on: a response still starts.
    outs = session.receive(json.dumps({"type": "response.create"}))
    assert any(isinstance(o, StartResponse) for o in outs)
