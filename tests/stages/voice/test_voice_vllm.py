"""The voice LLM on vLLM (runtime: vllm) with a tiny chat checkpoint built in code:
greedy answers of streams batched in the engine equal the stage's torch answers, a
closed stream's request is aborted, a prompt vLLM refuses fails its stream alone,
tool-call turns stay on torch, and the params that cannot hold are refused.

Needs the engine's environment (``scripts/setup vllm``: .venv-vllm); without it the
engine tests skip, naming what is missing. One engine serves the module (a start
takes seconds).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnitrio import Request, StreamWork, TextDelta
from tests.stages.voice.llm_support import WEATHER_TOOL, run_streams
from tests.voice_support import needs_voice

pytestmark = needs_voice

MAX_MODEL_LEN = 512
QUESTIONS = {  # of different lengths, so the batch's rows differ
    "a": "Hello there",
    "b": "What is the weather like in Paris today?",
    "c": "ok",
    "d": "Tell me a story about a dragon",
}


def _stage(checkpoint: Path, **params: object) -> object:
    from stages.voice.llm import SmolLM2Llm

    return SmolLM2Llm(
        "llm",
        model_path=str(checkpoint),
        dtype="float32",  # greedy answers independent of the batch (llm.py DTYPES)
        repetition_penalty=1.0,  # vLLM's counts the prompt too; the torch sampler's does not
        max_new_tokens=24,
        **params,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("params", "refused"),
    [
        ({"dtype": "int8"}, "takes dtype bfloat16 or float32, not int8"),
        ({"first_audio_first": True}, "first_audio_first holds one answer's tokens"),
    ],
)
def test_params_vllm_cannot_hold_are_refused_before_anything_loads(
    tmp_path: Path, params: dict[str, object], refused: str
) -> None:
    from stages.voice.llm import SmolLM2Llm

    with pytest.raises(ValueError, match=refused):
        SmolLM2Llm("llm", model_path=str(tmp_path / "none"), runtime="vllm", **params)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stages._vllm_engine import VllmUnavailable, engine_python
    from stages.voice.llm_tiny import make_tiny_chat_checkpoint

    try:
        engine_python()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    return make_tiny_chat_checkpoint(tmp_path_factory.mktemp("tiny-chat"))


def test_vllm_compile_starts_the_engine_compiled(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Param ``vllm_compile`` reaches ``VllmEngine.start`` (off by default): the start is
    stopped there, a compiled start being a minute's compile."""
    from stages.kit import VllmEngine

    class Started(Exception):
        pass

    seen: list[bool] = []

    def start(cls: object, model: str, **params: object) -> None:
        seen.append(bool(params["compiled"]))
        raise Started

    monkeypatch.setattr(VllmEngine, "start", classmethod(start))
    for params in ({}, {"vllm_compile": True}):
        with pytest.raises(Started):
            _stage(checkpoint, runtime="vllm", **params)
    assert seen == [False, True]


@pytest.fixture(scope="module")
def llm(checkpoint: Path) -> Iterator[object]:
    stage = _stage(checkpoint, runtime="vllm", vllm_max_model_len=MAX_MODEL_LEN)
    # Its packaging thread (the torch turns') starts with the module's stage, not in a test.
    stage.packager.submit((), dict)  # type: ignore[attr-defined]
    yield stage
    stage.close()  # type: ignore[attr-defined]


def test_batched_answers_equal_the_torch_answers(checkpoint: Path, llm: object) -> None:
    """Four streams in the engine at once, each greedy answer token for token the
    stage's torch path's (float32), decoded side by side."""
    reference = _stage(checkpoint)
    try:
        expected, _, expected_events = run_streams(reference, QUESTIONS)
    finally:
        reference.close()  # type: ignore[attr-defined]
    texts, order, events = run_streams(llm, QUESTIONS)
    assert texts == expected
    assert all(texts.values())
    assert [e[-1].data for e in events.values()] == [e[-1].data for e in expected_events.values()]
    # side by side: every stream had text out before the first one ended
    first_end = min(max(i for i, sid in enumerate(order) if sid == s) for s in QUESTIONS)
    assert set(order[:first_end]) == set(QUESTIONS)
    assert llm.fast.unfinished() == 0  # type: ignore[attr-defined]


def _step(llm: object, sid: str, inputs: tuple[object, ...] = ()) -> object:
    return llm.step([StreamWork(sid, inputs, True)])[sid]  # type: ignore[attr-defined]


def test_a_closed_stream_is_aborted_in_the_engine(llm: object) -> None:
    from stages.voice.payloads import Utterance

    for sid in ("kept", "closed"):
        llm.open_stream(sid, Request(options={"max_tokens": 400}))  # type: ignore[attr-defined]
        _step(llm, sid, (Utterance(QUESTIONS["d"]),))
    answers = {sid: llm.streams[sid].fast for sid in ("kept", "closed")}  # type: ignore[attr-defined]
    assert all(a is not None for a in answers.values())
    while not llm.streams["closed"].generated:  # type: ignore[attr-defined]
        _step(llm, "closed")
    llm.close_stream("closed")  # type: ignore[attr-defined]
    assert llm.fast.wait_ended(answers["closed"], 30.0)  # type: ignore[attr-defined]
    assert not answers["kept"].ended  # type: ignore[union-attr]
    assert llm.fast.unfinished() == 1  # type: ignore[attr-defined]  # freed at once
    llm.close_stream("kept")  # type: ignore[attr-defined]
    assert llm.fast.wait_ended(answers["kept"], 30.0)  # type: ignore[attr-defined]
    assert llm.fast.unfinished() == 0  # type: ignore[attr-defined]


def test_a_prompt_vllm_refuses_fails_its_stream_alone(llm: object) -> None:
    """A prompt longer than the engine's max_model_len: that stream's error, named; the
    stream beside it answers."""
    from stages.kit import OptionError
    from stages.voice.payloads import Utterance

    long = "word " * MAX_MODEL_LEN  # ~2,500 byte tokens, cut to max_prompt_tokens (768)
    llm.open_stream("long", Request())  # type: ignore[attr-defined]
    llm.open_stream("short", Request())  # type: ignore[attr-defined]
    inputs = {"long": (Utterance(long),), "short": (Utterance(QUESTIONS["a"]),)}
    errors: dict[str, BaseException] = {}
    text, done = "", False
    while not done:
        batch = [StreamWork(sid, inputs.pop(sid, ()), True) for sid in ("long", "short")]
        outputs = llm.step([w for w in batch if w.stream_id not in errors])  # type: ignore[attr-defined]
        for sid, out in outputs.items():
            if out.error is not None:
                errors[sid] = out.error
            elif sid == "short":
                text += "".join(i.text for i in out.visible if isinstance(i, TextDelta))
                done = out.done
    for sid in ("long", "short"):
        llm.close_stream(sid)  # type: ignore[attr-defined]
    assert list(errors) == ["long"]
    assert isinstance(errors["long"], OptionError)
    assert "maximum model length" in str(errors["long"]) or str(MAX_MODEL_LEN) in str(
        errors["long"]
    )
    assert len(text) > 0


def test_a_turn_that_may_call_a_tool_stays_on_torch(llm: object) -> None:
    """Tool calls are grammar-constrained on the stage's own model (llm.py)."""
    from stages.voice.payloads import Utterance

    llm.open_stream("tools", Request(options={"tools": json.dumps([WEATHER_TOOL])}))  # type: ignore[attr-defined]
    llm.open_stream("speech", Request())  # type: ignore[attr-defined]
    for sid in ("tools", "speech"):
        _step(llm, sid, (Utterance(QUESTIONS["b"]),))
    assert llm.streams["tools"].fast is None  # type: ignore[attr-defined]
    assert llm.streams["speech"].fast is not None  # type: ignore[attr-defined]
    for sid in ("tools", "speech"):
        llm.close_stream(sid)  # type: ignore[attr-defined]
