"""Function calling through the official ``openai`` SDK on the real LLM stage (SmolLM2):
calls generated under a grammar built from the tools' JSON schemas."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
import trio

import omnitrio
from omnitrio.server import ServerSettings, serve
from tests.voice_support import needs_voice

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
BOOKING = {
    "type": "function",
    "function": {
        "name": "book_table",
        "description": "Book a table at a restaurant.",
        "parameters": {
            "type": "object",
            "properties": {
                "size": {"type": "string", "enum": ["small", "medium", "large"]},
                "when": {
                    "type": "object",
                    "properties": {
                        "day": {"type": "string", "enum": ["monday", "friday"]},
                        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                    },
                    "required": ["day", "hour"],
                    "additionalProperties": False,
                },
            },
            "required": ["size", "when"],
            "additionalProperties": False,
        },
    },
}


def llm_config() -> omnitrio.PipelineConfig:
    """The voice chat's LLM stage alone (text in, text out), before a sink for its text."""
    return omnitrio.parse_config(
        {
            "pipeline": {"name": "llm", "max_streams": 4, "shutdown_timeout_s": 10.0},
            "stages": [
                {"name": "llm", "impl": "stages.voice.llm:SmolLM2Llm", "step_timeout_s": 120.0},
                {
                    "name": "sink",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"outputs_per_input": 0, "visible_every": 0},
                },
            ],
            "edges": [{"from": "llm", "to": "sink"}],
        }
    )


@pytest.fixture
async def client(nursery: trio.Nursery) -> openai.OpenAI:
    binds = await nursery.start(serve, llm_config(), ServerSettings(port=0))
    return openai.OpenAI(base_url=f"{binds[0]}/v1", api_key="unused", max_retries=0)


async def _in_thread(fn: Any) -> Any:
    return await trio.to_thread.run_sync(fn)


async def test_weather_round_trip_by_text(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]

    def ask_for_call() -> Any:
        return client.chat.completions.create(
            model="llm", messages=messages, tools=[WEATHER], tool_choice="required"
        )

    first = await _in_thread(ask_for_call)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    # Compact JSON under the grammar, and with no layout to spend tokens on, the small
    # model fills the value from the question (free whitespace gave it {"city": ""}).
    assert call.function.arguments == '{"city": "Paris"}'
    assert first.usage.prompt_tokens > 0

    messages.append(choice.message.model_dump(exclude_none=True))
    result = {"city": arguments["city"], "sky": "sunny", "celsius": 24}
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})

    def answer() -> Any:
        return client.chat.completions.create(
            model="llm", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=40
        )

    second = await _in_thread(answer)
    text = second.choices[0].message.content
    assert second.choices[0].finish_reason in ("stop", "length")
    assert text
    assert not second.choices[0].message.tool_calls
    assert "sunny" in text.lower() or "24" in text, text


async def test_named_function_with_enum_and_nested_object_streams_tool_call_deltas(
    client: openai.OpenAI,
) -> None:
    def run() -> tuple[list[Any], list[str | None], Any]:
        stream = client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "Book a big table for Friday at 8 pm."}],
            tools=[WEATHER, BOOKING],
            tool_choice={"type": "function", "function": {"name": "book_table"}},
            stream=True,
            stream_options={"include_usage": True},
        )
        deltas, reasons, usage = [], [], None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                deltas += choice.delta.tool_calls or []
                reasons.append(choice.finish_reason)
        return deltas, reasons, usage

    deltas, reasons, usage = await _in_thread(run)
    assert reasons[-1] == "tool_calls"
    assert deltas[0].id
    assert deltas[0].function.name == "book_table"
    assert len(deltas) > 2  # the arguments came in pieces
    assert {d.index for d in deltas} == {0}
    arguments = json.loads("".join(d.function.arguments or "" for d in deltas))
    jsonschema.validate(arguments, BOOKING["function"]["parameters"])
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_max_tokens_cuts_the_answer_with_finish_reason_length(
    client: openai.OpenAI,
) -> None:
    def run() -> Any:
        return client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "Tell me a long story about a dragon."}],
            max_completion_tokens=5,
        )

    reply = await _in_thread(run)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens > 10


async def test_bad_tool_requests_are_400s_naming_the_field(client: openai.OpenAI) -> None:
    def named_unknown() -> Any:
        return client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "hi"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )

    def bad_arguments() -> Any:
        return client.chat.completions.create(
            model="llm",
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{not json"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            tools=[WEATHER],
        )

    for call, field in ((named_unknown, "tool_choice"), (bad_arguments, "arguments")):
        with pytest.raises(openai.BadRequestError) as caught:
            await _in_thread(call)
        assert field in str(caught.value)
