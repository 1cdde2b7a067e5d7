"""One set of rules for tools on both API dialects, through the official ``openai`` SDK
on the real LLM stage: a function name that breaks the pattern, two functions of one
name, and a parameters schema the tool-call grammar (llguidance) cannot compile are
refused before a stream is opened, naming the param and the tool; the server stays up."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import trio

import omnitrio
import omnitrio.tools
from omnitrio.server import ServerSettings, serve
from tests.server.test_function_calling import WEATHER, llm_config
from tests.voice_support import needs_voice

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

# Valid JSON Schema, but its pattern uses a look-behind, which llguidance's regex
# engine cannot compile: before the check, the stream failed with a StageError (500).
UNCOMPILABLE = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "(?<=a)b"}},
    "required": ["city"],
}


def _function(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Realtime tool (flat); ``_chat`` nests it the way chat completions do."""
    return {
        "type": "function",
        "name": name,
        "description": "A tool.",
        "parameters": parameters or WEATHER["function"]["parameters"],  # type: ignore[index]
    }


def _chat(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


# (case, the tools, the field of the tool the error names, which tool, words in the message)
BAD_TOOLS = [
    ("pattern", [_function("get weather")], 0, "name", "get weather"),
    ("duplicate", [_function("f"), _function("f")], 1, "name", "two functions"),
    ("schema", [_function("f"), _function("g", UNCOMPILABLE)], 1, "parameters", "'g'"),
]


@pytest.fixture
async def client(nursery: trio.Nursery) -> openai.OpenAI:
    binds = await nursery.start(serve, llm_config(), ServerSettings(port=0))
    return openai.OpenAI(base_url=f"{binds[0]}/v1", api_key="unused", max_retries=0)


def _weather_call(client: openai.OpenAI) -> str:
    """A good request right after: the server is up and the LLM still calls tools."""
    reply = client.chat.completions.create(
        model="llm",
        messages=[{"role": "user", "content": "What is the weather like in Paris?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
    )
    (call,) = reply.choices[0].message.tool_calls or []
    return call.function.name  # type: ignore[union-attr]


@pytest.mark.parametrize(("case", "tools", "index", "field", "words"), BAD_TOOLS)
async def test_chat_completions_refuse_bad_tools_with_a_400_naming_them(
    client: openai.OpenAI,
    case: str,
    tools: list[dict[str, Any]],
    index: int,
    field: str,
    words: str,
) -> None:
    def bad() -> Any:
        return client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "hi"}],
            tools=[_chat(t) for t in tools],  # type: ignore[misc]
            stream=case == "schema",  # a streamed request is refused before its body starts
        )

    with pytest.raises(openai.BadRequestError) as caught:
        await trio.to_thread.run_sync(bad)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == f"tools.{index}.function.{field}"
    assert words in error["message"]
    assert await trio.to_thread.run_sync(_weather_call, client) == "get_weather"


@pytest.mark.parametrize(("case", "tools", "index", "field", "words"), BAD_TOOLS)
async def test_realtime_refuses_bad_tools_with_an_error_event_naming_them(
    client: openai.OpenAI,
    case: str,
    tools: list[dict[str, Any]],
    index: int,
    field: str,
    words: str,
) -> None:
    def run() -> list[Any]:
        errors = []
        with client.realtime.connect(model="llm") as conn:
            assert conn.recv().type == "session.created"
            conn.session.update(session={"type": "realtime", "tools": tools})  # type: ignore[typeddict-item]
            errors.append(conn.recv())
            # refused field by field: the rest of the update applies, and is shown
            assert conn.recv().type == "session.updated"
            conn.response.create(response={"tools": tools})  # type: ignore[typeddict-item]
            errors.append(conn.recv())
            # The session is still usable: a good update is answered.
            conn.session.update(session={"type": "realtime", "tools": [_function("f")]})
            assert conn.recv().type == "session.updated"
        return errors

    with trio.fail_after(60):
        update_error, response_error = await trio.to_thread.run_sync(run)
    for event, where in ((update_error, "session"), (response_error, "response")):
        assert event.type == "error", event
        assert event.error.param == f"{where}.tools[{index}].{field}"
        assert event.error.code == "invalid_value"
        assert words in event.error.message
    assert await trio.to_thread.run_sync(_weather_call, client) == "get_weather"


# (the arguments a replayed call carries, words of the one rule's message)
BAD_ARGUMENTS = [("{not json", "not JSON"), ("[1, 2]", "must be a JSON object")]


@pytest.mark.parametrize(("arguments", "words"), BAD_ARGUMENTS)
async def test_both_dialects_refuse_call_arguments_that_are_not_a_json_object(
    client: openai.OpenAI, arguments: str, words: str
) -> None:
    """A call the client replays meets one rule (``omnitrio.tools.arguments_json``) on
    both dialects: a 400 on chat completions, an error event on Realtime, each naming
    the param; Realtime adds no item and the session goes on."""

    def chat() -> Any:
        call = {"name": "get_weather", "arguments": arguments}
        return client.chat.completions.create(
            model="llm",
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            tools=[WEATHER],  # type: ignore[list-item]
        )

    with pytest.raises(openai.BadRequestError) as caught:
        await trio.to_thread.run_sync(chat)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "messages.1.tool_calls.0.function.arguments"
    assert words in error["message"]

    def realtime() -> list[Any]:
        received = []
        call = {"type": "function_call", "name": "get_weather"}
        output = {"type": "function_call_output", "output": "sunny"}
        with client.realtime.connect(model="llm") as conn:
            assert conn.recv().type == "session.created"
            conn.conversation.item.create(item={**call, "call_id": "bad", "arguments": arguments})  # type: ignore[typeddict-item]
            received.append(conn.recv())
            # Nothing half-added: the refused call has no item an output could answer.
            conn.conversation.item.create(item={**output, "call_id": "bad"})  # type: ignore[typeddict-item]
            received.append(conn.recv())
            # The session goes on: a good call and its output are taken.
            good = '{"city": "Paris"}'
            conn.conversation.item.create(item={**call, "call_id": "good", "arguments": good})  # type: ignore[typeddict-item]
            received += [conn.recv(), conn.recv()]
            conn.conversation.item.create(item={**output, "call_id": "good"})  # type: ignore[typeddict-item]
            received += [conn.recv(), conn.recv()]
        return received

    with trio.fail_after(60):
        refused, unanswerable, *taken = await trio.to_thread.run_sync(realtime)
    assert refused.type == "error", refused
    assert refused.error.param == "item.arguments"
    assert refused.error.code == "invalid_value"
    assert words in refused.error.message
    assert unanswerable.type == "error", unanswerable
    assert unanswerable.error.param == "item.call_id"
    assert [e.type for e in taken] == ["conversation.item.added", "conversation.item.done"] * 2
    assert taken[1].item.arguments == '{"city": "Paris"}'
    assert await trio.to_thread.run_sync(_weather_call, client) == "get_weather"


async def test_the_python_api_gets_the_stage_error_naming_the_tool() -> None:
    """Without the server's check, the LLM stage still refuses the schema, naming it."""
    tools = [omnitrio.tools.FunctionTool("g", "", UNCOMPILABLE)]
    options = omnitrio.ResponseOptions(
        tools=tuple(tools), tool_choice=omnitrio.tools.ToolChoice("required")
    )
    async with omnitrio.open_pipeline(llm_config()) as pipeline:
        with pytest.raises(omnitrio.StageError, match="'g'"):
            async with pipeline.open_stream(omnitrio.Request("hi", options=options)) as stream:
                async for _ in stream:
                    pass


def test_the_rules_are_one_function() -> None:
    ok = omnitrio.tools.FunctionTool("get_weather", "", {"type": "object"})
    omnitrio.tools.check_tools([ok])
    for tools, field in (
        ([omnitrio.tools.FunctionTool("a b")], "name"),
        ([ok, ok], "name"),
        ([omnitrio.tools.FunctionTool("g", "", UNCOMPILABLE)], "parameters"),
    ):
        with pytest.raises(omnitrio.tools.ToolError) as caught:
            omnitrio.tools.check_tools(tools)
        assert (caught.value.index, caught.value.field) == (len(tools) - 1, field)
    with pytest.raises(omnitrio.tools.ToolError) as caught:
        omnitrio.tools.check_tool_choice([ok], omnitrio.tools.ToolChoice("required", "nope"))
    assert caught.value.field == "tool_choice"
    options = omnitrio.tools.with_tools(
        omnitrio.ResponseOptions(), [ok], omnitrio.tools.ToolChoice()
    )
    assert json.loads(str(options.as_mapping()["tools"]))[0]["name"] == "get_weather"
