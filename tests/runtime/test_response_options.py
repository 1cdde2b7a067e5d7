"""ResponseOptions: the one typed shape a response's options travel in."""

from __future__ import annotations

import json
import pickle

import pytest

import omnitrio
from omnitrio import Request, ResponseOptions
from omnitrio.tools import FunctionTool, ToolChoice


def test_a_mapping_is_read_into_fields_and_knobs() -> None:
    tools = json.dumps([{"name": "f", "parameters": {"type": "object"}}])
    request = Request(
        "hi",
        options={
            "modalities": "text,audio",
            "max_tokens": 8,
            "temperature": 0,
            "seed": 3,
            "voice": "alloy",
            "tools": tools,
            "tool_choice": "required",
            "tool_name": "f",
            "talker.max_tokens": 20,
            "steps": 4,
        },
    )
    options = request.options
    assert options.modalities == ("text", "audio")
    assert (options.max_tokens, options.temperature, options.seed) == (8, 0, 3)
    assert options.voice == "alloy"
    assert options.tools == (FunctionTool("f", "", {"type": "object"}),)
    assert options.tool_choice == ToolChoice("required", "f")
    assert dict(options.knobs) == {"talker.max_tokens": 20, "steps": 4}
    assert ResponseOptions.from_mapping(options.as_mapping()) == options


def test_both_spellings_of_modalities_are_one_field() -> None:
    http = Request(options={"modalities": "text"}).options
    realtime = Request(options={"output_modalities": "text"}).options
    assert http == realtime == ResponseOptions(modalities=("text",))
    assert not http.wants("audio")
    assert ResponseOptions().wants("audio")  # unset: the pipeline's default, everything


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"temperature": "hot"}, "'temperature' must be a number"),
        ({"max_tokens": 2.5}, "'max_tokens' must be a whole number"),
        ({"seed": True}, "'seed' must be a whole number"),
        ({"voice": 3}, "'voice' must be a str"),
        ({"modalities": "text,video"}, "'modalities' must list text or audio"),
        ({"tool_choice": "always"}, "'tool_choice' must be one of"),
        ({"tools": "not json"}, "'tools' must be a JSON list of functions"),
    ],
)
def test_a_known_option_of_the_wrong_type_is_refused_by_name(
    options: dict[str, omnitrio._items.Scalar], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        Request("hi", options=options)


def test_options_are_frozen_and_pickle() -> None:
    options = ResponseOptions(max_tokens=4, tools=(FunctionTool("g"),), knobs={"fault.hang_at": 1})
    with pytest.raises(TypeError):
        options.knobs["fault.hang_at"] = 2  # type: ignore[index]
    request = Request("x", options=options)
    assert pickle.loads(pickle.dumps(request)) == request
    assert Request("x").options == ResponseOptions()
