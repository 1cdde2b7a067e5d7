"""The voice LLM on CTranslate2 (runtime: ctranslate2): answers stream token by token,
conversations decode side by side (none waits for another's whole answer), the
system prompt goes in as CTranslate2's cached static prompt, a cancelled answer
stops, and tool-call turns stay on torch with their grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from omnitrio import Request, StreamWork
from tests.stages.voice.llm_support import (
    WEATHER_TOOL,
    check_a_speaking_answer_waits_while_a_first_phrase_is_synthesised,
    check_answers_decode_side_by_side_and_equal_the_answers_alone,
    run_streams,
)
from tests.voice_support import needs_voice

pytestmark = needs_voice


@pytest.fixture
def llm() -> Iterator[object]:
    """One per test: its packaging thread (torch turns) ends with it."""
    from stages.voice.llm import SmolLM2Llm

    stage = SmolLM2Llm("llm", max_new_tokens=24, runtime="ctranslate2", num_workers=2)
    yield stage
    stage.close()


def test_answers_decode_side_by_side_and_equal_the_answers_alone(llm: object) -> None:
    check_answers_decode_side_by_side_and_equal_the_answers_alone(llm)


def test_the_system_message_is_the_cached_static_prompt(llm: object) -> None:
    from stages.voice.llm import _Stream  # the stream's state, to see the split

    llm.open_stream("s", Request(options={"instructions": "Answer briefly."}))  # type: ignore[attr-defined]
    turn: _Stream = llm.streams["s"]  # type: ignore[attr-defined]
    system = llm._system_ids(turn)  # type: ignore[attr-defined]
    from stages.voice.payloads import Utterance

    turn.prompt = llm._prompt_ids(turn, [Utterance("Hello!")])  # type: ignore[attr-defined]
    assert turn.prompt[: len(system)] == system
    assert len(system) < len(turn.prompt)
    llm.close_stream("s")  # type: ignore[attr-defined]


def test_a_cancelled_answer_stops_generating(llm: object) -> None:
    from stages.voice.payloads import Utterance

    llm.open_stream("x", Request(options={"max_tokens": 200}))  # type: ignore[attr-defined]
    llm.step([StreamWork("x", (Utterance("Tell me a long story."),), True)])  # type: ignore[attr-defined]
    answer = llm.streams["x"].fast  # type: ignore[attr-defined]
    llm.close_stream("x")  # type: ignore[attr-defined]  # what cancelling does
    (result,) = [answer.result.result()]  # returns once the callback has stopped it
    assert len(result.sequences_ids[0]) < 200


def test_a_tool_call_turn_runs_on_torch_under_its_grammar(llm: object) -> None:
    options = {"tools": json.dumps([WEATHER_TOOL]), "tool_choice": "required"}
    texts, _, events = run_streams(llm, {"t": "What is the weather like in Paris?"}, options)
    names = [e.name for e in events["t"]]
    assert names[0] == "tool_call"
    done = next(e for e in events["t"] if e.name == "tool_call.done")
    assert done.data["name"] == "get_weather"
    assert "city" in json.loads(str(done.data["arguments"]))
    assert events["t"][-1].data["finish_reason"] == "tool_calls"
    assert texts["t"] == ""  # a call is never spoken


def test_an_unknown_runtime_is_refused_naming_the_choices() -> None:
    from stages.voice.llm import SmolLM2Llm

    with pytest.raises(
        ValueError, match=r"runtime must be one of .*'ctranslate2', 'llamacpp'.*'onnx'"
    ):
        SmolLM2Llm("llm", runtime="onnx")


def test_an_answer_speaking_waits_while_a_first_phrase_is_synthesised(
    llm: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_a_speaking_answer_waits_while_a_first_phrase_is_synthesised(llm, monkeypatch)
