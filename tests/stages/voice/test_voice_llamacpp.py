"""The voice LLM on llama.cpp (runtime: llamacpp), with the packaged GGUF itself: answers
stream token by token, conversations decode side by side (none waits for another's
whole answer) and one more than the workers queues, a worker reuses the KV cache of
the prompt prefix it already holds (the system message, a conversation's earlier
turns), a cancelled answer stops, errors reach the stage, first_audio_first holds, and
tool-call turns stay on torch. Skipped where llama-cpp-python (built from source) is
not installed."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnitrio import Request, StreamWork, TextDelta
from tests.stages.voice.llm_support import (
    WEATHER_TOOL,
    check_a_speaking_answer_waits_while_a_first_phrase_is_synthesised,
    check_answers_decode_side_by_side_and_equal_the_answers_alone,
    run_streams,
)
from tests.voice_support import needs_voice

pytestmark = [
    needs_voice,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama-cpp-python is not installed (optional, built from source: docs/models.md)",
    ),
]


@pytest.fixture
def llm() -> Iterator[object]:
    """One per test, two workers: its threads (and the torch turns' packaging thread)
    end with it."""
    from stages.voice.llm import SmolLM2Llm

    stage = SmolLM2Llm("llm", max_new_tokens=24, runtime="llamacpp", num_workers=2)
    yield stage
    stage.close()


def test_answers_decode_side_by_side_and_equal_the_answers_alone(llm: object) -> None:
    check_answers_decode_side_by_side_and_equal_the_answers_alone(llm)


def test_more_answers_than_workers_queue_and_all_finish(llm: object) -> None:
    questions = {"a": "What do cats like to eat?", "b": "Why is the sky blue?", "c": "Hello!"}
    alone = {sid: run_streams(llm, {sid: q})[0][sid] for sid, q in questions.items()}
    # Two workers: one of the three answers waits for a free one.
    together, _, events = run_streams(llm, questions)
    assert together == alone
    assert all(e[-1].name == "llm.finish" for e in events.values())


def test_a_worker_reuses_the_cached_prefix_of_the_conversation(llm: object) -> None:
    """The next turn goes to the worker holding the conversation so far: only the new
    message is prefilled; another conversation still reuses the system message."""
    from stages.voice.payloads import Utterance

    def answer_of(sid: str, question: str, history: str) -> tuple[str, object, list[int]]:
        llm.open_stream(sid, Request(text=history))  # type: ignore[attr-defined]
        turn = llm.streams[sid]  # type: ignore[attr-defined]
        text, done = "", False
        outputs = llm.step([StreamWork(sid, (Utterance(question),), True)])  # type: ignore[attr-defined]
        answer, prompt = turn.fast, list(turn.prompt)
        while True:
            output = outputs[sid]
            text += "".join(i.text for i in output.visible if isinstance(i, TextDelta))
            done = bool(output.done)
            if done:
                break
            outputs = llm.step([StreamWork(sid, (), True)])  # type: ignore[attr-defined]
        llm.close_stream(sid)  # type: ignore[attr-defined]
        return text, answer, prompt

    first, _, first_prompt = answer_of("t1", "What do cats like to eat?", "")
    history = f"user: What do cats like to eat?\nassistant: {first}"
    _, second, second_prompt = answer_of("t2", "And dogs?", history)
    assert second_prompt[: len(first_prompt)] == first_prompt
    assert second.reused_tokens >= len(first_prompt)  # type: ignore[attr-defined]
    _, other, _ = answer_of("o", "Why is the sky blue?", "")
    llm.open_stream("probe", Request())  # type: ignore[attr-defined]
    system = llm.prompt.system_ids(llm.streams["probe"])  # type: ignore[attr-defined]
    llm.close_stream("probe")  # type: ignore[attr-defined]
    assert other.reused_tokens >= len(system)  # type: ignore[attr-defined]


def test_a_cancelled_answer_stops_generating(llm: object) -> None:
    from stages.voice.payloads import Utterance

    llm.open_stream("x", Request(options={"max_tokens": 200}))  # type: ignore[attr-defined]
    llm.step([StreamWork("x", (Utterance("Tell me a long story."),), True)])  # type: ignore[attr-defined]
    answer = llm.streams["x"].fast  # type: ignore[attr-defined]
    llm.close_stream("x")  # type: ignore[attr-defined]  # what cancelling does
    llm.fast.wait_ended(answer)  # type: ignore[attr-defined]
    assert answer.ended
    assert len(answer.arrived) < 200
    assert not any(last for _, last in answer.arrived)  # stopped before its end


def test_a_prompt_too_long_for_the_context_fails_the_stream_naming_why() -> None:
    from stages.voice.llm import SmolLM2Llm
    from stages.voice.payloads import Utterance

    stage = SmolLM2Llm("llm", runtime="llamacpp", num_workers=1, max_prompt_tokens=4096)
    try:
        stage.open_stream("long", Request())
        question = (Utterance("cat " * 2100),)
        with pytest.raises(ValueError, match=r"no room in the llama\.cpp context"):
            stage.step([StreamWork("long", question, True)])
            while True:
                stage.step([StreamWork("long", (), True)])
        stage.close_stream("long")
    finally:
        stage.close()


def test_a_safetensors_folder_is_refused_naming_the_param(tmp_path: Path) -> None:
    from stages.voice.llm import SmolLM2Llm

    with pytest.raises(ValueError, match=r"runtime llamacpp reads a \.gguf file; model_path"):
        SmolLM2Llm("llm", runtime="llamacpp", model_path=str(tmp_path))


def test_a_tool_call_turn_runs_on_torch_under_its_grammar(llm: object) -> None:
    options = {"tools": json.dumps([WEATHER_TOOL]), "tool_choice": "required"}
    texts, _, events = run_streams(llm, {"t": "What is the weather like in Paris?"}, options)
    assert events["t"][0].name == "tool_call"
    done = next(e for e in events["t"] if e.name == "tool_call.done")
    assert done.data["name"] == "get_weather"
    assert "city" in json.loads(str(done.data["arguments"]))
    assert texts["t"] == ""  # a call is never spoken


def test_an_answer_speaking_waits_while_a_first_phrase_is_synthesised(
    llm: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_a_speaking_answer_waits_while_a_first_phrase_is_synthesised(llm, monkeypatch)
