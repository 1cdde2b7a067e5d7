"""The one fold of an answer's items that chat completions and Realtime both format."""

from __future__ import annotations

from omnitrio import AudioChunk, Event, TextDelta
from omnitrio._answer import (
    AnswerAssembler,
    CallArguments,
    CallDone,
    CallStarted,
    Finished,
    ToolCall,
)
from omnitrio.tools import FINISH_EVENT, TOOL_ARGUMENTS_EVENT, TOOL_CALL_EVENT, TOOL_DONE_EVENT


def test_text_audio_calls_and_the_finish_become_typed_events() -> None:
    answer = AnswerAssembler()
    audio = AudioChunk(b"\0\0" * 4, 24000)
    items = [
        TextDelta("Let me check."),
        audio,
        Event(TOOL_CALL_EVENT, {"call_id": "c1", "name": "get_weather"}),
        Event(TOOL_ARGUMENTS_EVENT, {"call_id": "c1", "delta": '{"city": '}),
        Event(TOOL_ARGUMENTS_EVENT, {"call_id": "c1", "delta": '"Paris"}'}),
        Event(TOOL_CALL_EVENT, {"call_id": "c2", "name": "get_time"}),
        Event(TOOL_DONE_EVENT, {"call_id": "c1", "arguments": '{"city": "Paris"}'}),
        Event(TOOL_DONE_EVENT, {"call_id": "c2", "arguments": "{}"}),
        Event(FINISH_EVENT, {"finish_reason": "tool_calls", "prompt_tokens": 12}),
        Event("transcript", {"text": "hi"}),
    ]
    events = [e for item in items for e in answer.take(item)]
    assert events == [
        TextDelta("Let me check."),
        audio,
        CallStarted(0, "c1", "get_weather"),
        CallArguments(0, "c1", '{"city": '),
        CallArguments(0, "c1", '"Paris"}'),
        CallStarted(1, "c2", "get_time"),
        CallDone(0, "c1", "get_weather", '{"city": "Paris"}'),
        CallDone(1, "c2", "get_time", "{}"),
        Finished("tool_calls", 12, None),
        Event("transcript", {"text": "hi"}),  # not the LLM's: passed on as it came
    ]
    assert answer.calls == (
        ToolCall("c1", "get_weather", '{"city": "Paris"}'),
        ToolCall("c2", "get_time", "{}"),
    )
    assert answer.num_text_deltas == 1
    assert answer.finished == Finished("tool_calls", 12, None)


def test_call_events_that_name_no_begun_call_are_dropped() -> None:
    answer = AnswerAssembler()
    assert answer.take(Event(TOOL_ARGUMENTS_EVENT, {"call_id": "nope", "delta": "{"})) == []
    assert answer.take(Event(TOOL_CALL_EVENT, {"name": "f"})) == []  # no call id
    assert answer.take(Event(TOOL_CALL_EVENT, {"call_id": "c", "name": "f"})) == [
        CallStarted(0, "c", "f")
    ]
    assert answer.take(Event(TOOL_CALL_EVENT, {"call_id": "c", "name": "f"})) == []  # again
    # A done without arguments keeps the pieces sent so far.
    answer.take(Event(TOOL_ARGUMENTS_EVENT, {"call_id": "c", "delta": "{}"}))
    assert answer.take(Event(TOOL_DONE_EVENT, {"call_id": "c"})) == [CallDone(0, "c", "f", "{}")]
    assert answer.finished is None
