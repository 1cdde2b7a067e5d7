"""The voice LLM on CTranslate2 (runtime: ctranslate2): answers stream token by token,
conversations decode side by side (none waits for another's whole answer), the
system prompt goes in as CTranslate2's cached static prompt, a cancelled answer
stops, and tool-call turns stay on torch with their grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from omnitrio import Event, Request, StreamWork, TextDelta
from tests.voice_support import needs_voice

pytestmark = needs_voice

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def llm() -> Iterator[object]:
    """One per test: its packaging thread (torch turns) ends with it."""
    from stages.voice.llm import SmolLM2Llm

    stage = SmolLM2Llm("llm", max_new_tokens=24, runtime="ctranslate2", num_workers=2)
    yield stage
    stage.close()


def _run(
    stage: object, questions: dict[str, str], options: dict[str, object] | None = None
) -> tuple[dict[str, str], list[str], dict[str, list[Event]]]:
    """Step the streams to the end together; their texts, which stream each text
    delta came from in order, and their events."""
    from stages.voice.payloads import Utterance

    for sid in questions:
        stage.open_stream(sid, Request(options=options or {}))  # type: ignore[attr-defined]
    texts = dict.fromkeys(questions, "")
    order: list[str] = []
    events: dict[str, list[Event]] = {sid: [] for sid in questions}
    first, active = True, set(questions)
    while active:
        batch = [
            StreamWork(sid, (Utterance(questions[sid]),) if first else (), True)
            for sid in sorted(active)
        ]
        first = False
        for sid, output in stage.step(batch).items():  # type: ignore[attr-defined]
            for item in output.visible:
                if isinstance(item, TextDelta) and item.text:
                    texts[sid] += item.text
                    order.append(sid)
                elif isinstance(item, Event):
                    events[sid].append(item)
            if output.done:
                active.discard(sid)
                stage.close_stream(sid)  # type: ignore[attr-defined]
    return texts, order, events


def test_answers_decode_side_by_side_and_equal_the_answers_alone(llm: object) -> None:
    questions = {"a": "What do cats like to eat?", "b": "Why is the sky blue?"}
    alone = {sid: _run(llm, {sid: q})[0][sid] for sid, q in questions.items()}
    together, order, events = _run(llm, questions)
    assert together == alone  # greedy, each answer decoded on its own
    assert "cat" in alone["a"].lower()
    assert alone["a"] != alone["b"]
    # Neither waited for the other's whole answer: b had text before a's last text.
    last_a = max(i for i, sid in enumerate(order) if sid == "a")
    assert order.index("b") < last_a
    (finish,) = events["a"]
    assert finish.name == "llm.finish"
    assert finish.data["completion_tokens"] > 3
    assert llm.streams == {}  # type: ignore[attr-defined]


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
    texts, _, events = _run(llm, {"t": "What is the weather like in Paris?"}, options)
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
    """first_audio_first: "speaking" (its first phrase out) holds its next token while a
    first phrase is synthesised; "writing" (first phrase not out yet) goes on to its end."""
    from stages.voice.first_audio import FIRST_AUDIO
    from stages.voice.payloads import Utterance

    monkeypatch.setattr(FIRST_AUDIO, "max_hold_s", 600.0)  # the hold, not its cap, is tested
    monkeypatch.setattr(llm, "first_audio_first", True)
    question = (Utterance("Tell me a long story about a dragon."),)
    held_before = FIRST_AUDIO.held_s
    texts = {"speaking": "", "writing": ""}

    def step(sid: str, inputs: tuple[object, ...] = ()) -> bool:
        output = llm.step([StreamWork(sid, inputs, True)])[sid]  # type: ignore[attr-defined]
        texts[sid] += "".join(i.text for i in output.visible if isinstance(i, TextDelta))
        return bool(output.done)

    for sid in texts:
        llm.open_stream(sid, Request(options={"max_tokens": 40}))  # type: ignore[attr-defined]
    FIRST_AUDIO.first_phrase_out("speaking")
    try:
        with FIRST_AUDIO.synthesizing():
            step("speaking", question)
            while not texts["speaking"]:
                step("speaking")  # its first token; its callback then holds
            held_text = texts["speaking"]
            step("writing", question)
            while not step("writing"):
                pass  # decodes to its end meanwhile
            step("speaking")
            assert texts["speaking"] == held_text  # not a token more while held
        while not step("speaking"):
            pass
    finally:
        FIRST_AUDIO.forget("speaking")
        for sid in texts:
            llm.close_stream(sid)  # type: ignore[attr-defined]
    assert len(texts["speaking"]) > len(held_text)
    assert texts["writing"]
    assert FIRST_AUDIO.held_s > held_before
