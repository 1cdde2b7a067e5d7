"""What the voice LLM's runtimes (CTranslate2, llama.cpp) are each tested with: streams
stepped to their end together, and the first-audio hold."""

from __future__ import annotations

import pytest

from omnitrio import Event, Request, StreamWork, TextDelta

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def run_streams(
    stage: object,
    questions: dict[str, str],
    options: dict[str, object] | None = None,
    history: str = "",
) -> tuple[dict[str, str], list[str], dict[str, list[Event]]]:
    """Step the streams to the end together; their texts, which stream each text
    delta came from in order, and their events."""
    from stages.voice.payloads import Utterance

    for sid in questions:
        stage.open_stream(sid, Request(text=history, options=options or {}))  # type: ignore[attr-defined]
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


def check_a_speaking_answer_waits_while_a_first_phrase_is_synthesised(
    llm: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """first_audio_first: "speaking" (its first phrase out) holds its next token while a
    first phrase is synthesised; "writing" (first phrase not out yet) goes on to its end."""
    from stages.voice.first_audio import FIRST_AUDIO
    from stages.voice.payloads import Utterance

    monkeypatch.setattr(FIRST_AUDIO, "max_hold_s", 600.0)  # the hold, not its cap, is tested
    monkeypatch.setattr(llm.answers, "first_audio_first", True)
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
                step("speaking")  # its first token; then it is held
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


def check_answers_decode_side_by_side_and_equal_the_answers_alone(llm: object) -> None:
    questions = {"a": "What do cats like to eat?", "b": "Why is the sky blue?"}
    alone = {sid: run_streams(llm, {sid: q})[0][sid] for sid, q in questions.items()}
    together, order, events = run_streams(llm, questions)
    assert together == alone  # greedy, each answer decoded on its own
    assert "cat" in alone["a"].lower()
    assert alone["a"] != alone["b"]
    # Neither waited for the other's whole answer: b had text before a's last text.
    last_a = max(i for i, sid in enumerate(order) if sid == "a")
    assert order.index("b") < last_a
    (finish,) = events["a"]
    assert finish.name == "llm.finish"
    assert finish.data["finish_reason"] in ("stop", "length")
    assert finish.data["completion_tokens"] > 3
    assert llm.streams == {}  # type: ignore[attr-defined]
