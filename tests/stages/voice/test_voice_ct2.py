"""The voice LLM on CTranslate2 (runtime: ctranslate2): answers stream token by token,
conversations decode side by side (none waits for another's whole answer), the
system message and the history go in as CTranslate2's static prompt, whose state is
made ahead once the turn before has ended and kept within a budget, a cancelled answer
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


def _conversation(*turns: tuple[str, str]) -> str:
    """Earlier turns as the Realtime session's conversation text."""
    return "\n".join(f"user: {q}\nassistant: {a}" for q, a in turns)


def _static_and_question(llm: object, sid: str, history: str, question: str) -> tuple[int, int]:
    """A turn's static prompt (tokens) and the rest that its answer prefills."""
    from stages.voice.payloads import Utterance

    llm.open_stream(sid, Request(text=history))  # type: ignore[attr-defined]
    turn = llm.streams[sid]  # type: ignore[attr-defined]
    prompt = llm.prompt.prompt_ids(turn, [Utterance(question)])  # type: ignore[attr-defined]
    llm.close_stream(sid)  # type: ignore[attr-defined]
    return turn.static_len, len(prompt) - turn.static_len


def test_the_next_turn_prefills_only_its_question(llm: object) -> None:
    """Once an answer has ended, the next turn's static prompt (the system message and
    the history with that turn in it) is prefilled ahead: the next answer starts on the
    kept state and prefills only its question."""
    first = "What do cats like to eat?"
    texts, _, _ = run_streams(llm, {"t1": first})
    assert llm.fast.flush(60.0)  # type: ignore[attr-defined]  # the warming thread is done
    states = llm.fast.states  # type: ignore[attr-defined]
    assert states.num_warmed == 1
    history = _conversation((first, texts["t1"]))
    second = "Why is the sky blue?"
    static, rest = _static_and_question(llm, "probe", history, second)
    _, question_alone = _static_and_question(llm, "probe", "", second)
    system, _ = _static_and_question(llm, "probe", "", second)
    assert rest == question_alone  # the question (and the answer's header) alone
    assert static > system + 20  # ... after the system message and the whole history
    texts2, _, _ = run_streams(llm, {"t2": second}, history=history)
    assert states.num_hits == 1  # the answer started on the state warmed ahead
    assert "blue" in texts2["t2"].lower() or "scatter" in texts2["t2"].lower()


def test_an_answer_on_a_warm_state_equals_the_answer_prefilled_cold(llm: object) -> None:
    """The prompt's split depends only on the conversation, never on whether its state
    was warm: a turn answered on a state warmed ahead and the same turn on a fresh
    stage (which prefills the static prompt itself) give the same tokens."""
    from stages.voice.llm import SmolLM2Llm

    first = "What is the capital of France?"
    texts, _, _ = run_streams(llm, {"t1": first})
    assert llm.fast.flush(60.0)  # type: ignore[attr-defined]
    history = _conversation((first, texts["t1"]))
    warm, _, _ = run_streams(llm, {"t2": "And of Italy?"}, history=history)
    assert llm.fast.states.num_hits == 1  # type: ignore[attr-defined]
    cold_stage = SmolLM2Llm("llm", max_new_tokens=24, runtime="ctranslate2", num_workers=2)
    try:
        cold, _, _ = run_streams(cold_stage, {"t2": "And of Italy?"}, history=history)
        assert cold_stage.fast.states.num_hits == 0  # type: ignore[union-attr]
    finally:
        cold_stage.close()
    assert warm == cold
    assert warm["t2"]


def test_the_kept_states_stay_within_their_budget() -> None:
    """With a budget of ~2 states, a long conversation replaces the generator again and
    again: the ledger stays under the budget, replaced generators are dropped once their
    answers end, and the state warmed for the next turn is carried over to the fresh one."""
    from stages.voice.llm import SmolLM2Llm

    budget = 200
    llm = SmolLM2Llm(
        "llm",
        max_new_tokens=12,
        runtime="ctranslate2",
        num_workers=2,
        max_history_messages=2,
        ctranslate2_cache_tokens=budget,
    )
    questions = ["Hi!", "What do cats eat?", "Why is the sky blue?", "Name a dog.", "Thanks!"]
    try:
        done: list[tuple[str, str]] = []
        for i, question in enumerate(questions * 2):
            texts, _, _ = run_streams(llm, {f"t{i}": question}, history=_conversation(*done))
            done.append((question, texts[f"t{i}"]))
            assert llm.fast.flush(60.0)  # type: ignore[union-attr]
            states = llm.fast.states  # type: ignore[union-attr]
            assert states.num_tokens <= budget
            assert llm.fast.num_generators <= 2  # type: ignore[union-attr]
        assert states.num_warmed == len(done)  # ~50-70 tokens each: 3-4 budgets in all
        assert states.num_recycled >= 2
        assert states.num_hits == len(done) - 1  # every later turn found its state
        run_streams(llm, {"last": "Bye!"}, history=_conversation(*done))
        assert llm.fast.flush(60.0)  # type: ignore[union-attr]  # dropped on the warming thread
        assert llm.fast.num_generators == 1  # type: ignore[union-attr]
    finally:
        llm.close()


def test_a_cancelled_answer_stops_generating(llm: object) -> None:
    from stages.voice.payloads import Utterance

    llm.open_stream("x", Request(options={"max_tokens": 200}))  # type: ignore[attr-defined]
    llm.step([StreamWork("x", (Utterance("Tell me a long story."),), True)])  # type: ignore[attr-defined]
    answer = llm.streams["x"].fast  # type: ignore[attr-defined]
    llm.close_stream("x")  # type: ignore[attr-defined]  # what cancelling does
    (result,) = [answer.result.result()]  # returns once the callback has stopped it
    assert len(result.sequences_ids[0]) < 200


def test_a_cancelled_answers_close_ends_its_start_and_a_finished_ones_does_not(
    llm: object,
) -> None:
    """A turn closed before its end (cancelled, its text already handed to the TTS)
    ends its start in first_audio.py at once (the others stop holding for it); a
    finished turn's close keeps its end on its way to the TTS (first_audio.py ``handed``)."""
    from stages.voice.first_audio import FIRST_AUDIO
    from stages.voice.payloads import TextPiece, Utterance

    FIRST_AUDIO.answer_starting("x")
    llm.open_stream("x", Request(options={"max_tokens": 200}))  # type: ignore[attr-defined]
    inputs: tuple[object, ...] = (Utterance("Tell me a long story."),)
    while not llm.streams["x"].spoke:  # type: ignore[attr-defined]
        llm.step([StreamWork("x", inputs, True)])  # type: ignore[attr-defined]
        inputs = ()
    assert "x" in FIRST_AUDIO._starting
    assert "x" in FIRST_AUDIO._handed
    llm.close_stream("x")  # type: ignore[attr-defined]  # what cancelling does
    assert "x" not in FIRST_AUDIO._starting
    assert "x" not in FIRST_AUDIO._handed
    try:
        FIRST_AUDIO.first_phrase_out("y")
        texts, _, _ = run_streams(llm, {"y": "Hi!"})  # closed at its end
        assert texts["y"]
        assert FIRST_AUDIO._handed["y"][1]  # its end handed on, still to reach the TTS
        FIRST_AUDIO.fed("y", (TextPiece(texts["y"]),), True)
    finally:
        FIRST_AUDIO.forget("y")


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


def _nice_of_threads() -> dict[str, int]:
    """Each thread of this process: its nice value (Linux)."""
    import os

    nice = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as stat:
            nice[tid] = int(stat.read().rsplit(")", 1)[1].split()[16])
    return nice


def test_ctranslate2_nice_raises_the_generators_threads_nice_value_only() -> None:
    """``ctranslate2_nice``: the generator's worker threads run at that nice value (the
    cores go to the TTS's and the ASR's threads first when all want them), raised by it
    from the caller's; the stage's own thread keeps its own."""
    import os
    import threading

    from stages.voice.llm import SmolLM2Llm

    before = _nice_of_threads()
    own = before[str(threading.get_native_id())]  # raised from the caller's, not set
    stage = SmolLM2Llm("llm", runtime="ctranslate2", num_workers=2, ctranslate2_nice=5)
    try:
        new = {tid: n for tid, n in _nice_of_threads().items() if tid not in before}
        assert sorted(new.values()).count(min(19, own + 5)) >= 2  # the two workers
        assert os.getpriority(os.PRIO_PROCESS, 0) == before[str(os.getpid())]
    finally:
        stage.close()
