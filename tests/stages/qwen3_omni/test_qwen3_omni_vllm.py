"""The Qwen3-Omni thinker on vLLM (engine: vllm): tokens, hidden states, aborts, the pipeline.

Needs the engine's environment (``scripts/setup vllm``: .venv-vllm); without it every
test here skips, naming what is missing. One engine process serves the module's engine
tests (a start takes seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import omnitrio

torch = pytest.importorskip("torch")

from stages.kit import (  # noqa: E402
    VllmEngine,
    VllmRequestError,
    VllmUnavailable,
)
from stages.qwen3_omni.tiny import make_tiny_checkpoint  # noqa: E402
from tests.stages.qwen3_omni.test_qwen3_omni import (  # noqa: E402
    GREEDY,
    frames_of,
    reference_run,
    run_streams,
    with_model_path,
)

# transformers' own generate() warns about its talker call; that is the reference's business.
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`")
VLLM_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "qwen3-omni-tiny-vllm.yaml"
STATES_ATOL = 1e-4
# The tiny audio encoder's output hardly depends on the sound (its LayerNorm'd states are
# mostly position): other audio moves the prompt's states by ~1e-5, so audio is compared
# tighter, and the test checks that other audio would fail it.
AUDIO_STATES_ATOL = 1e-6
# Prompts the torch parity tests do not use (held out), of different lengths.
HELD_OUT = ("a short one", "the engine that the field trusts, tried on a tiny model", "ok?")


def _engine_python_or_skip() -> None:
    from stages._vllm_engine import engine_python

    try:
        engine_python()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))


def test_a_missing_engine_environment_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OMNITRIO_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(VllmUnavailable, match=r"scripts/setup vllm"):
        VllmEngine.start(str(tmp_path))


def test_the_engine_param_is_checked_before_anything_loads(tmp_path: Path) -> None:
    from stages.kit import OptionError
    from stages.qwen3_omni.thinker import Qwen3OmniThinker

    with pytest.raises(OptionError, match="engine 'sglang' is not one of torch, vllm"):
        Qwen3OmniThinker("thinker", model_path=str(tmp_path), engine="sglang")
    with pytest.raises(OptionError, match="max_num_seqs apply to engine: vllm only"):
        Qwen3OmniThinker("thinker", model_path=str(tmp_path), max_num_seqs=4)


def test_the_engine_picks_the_class_and_the_constructor_keeps_its_signature() -> None:
    """``engine: vllm`` makes a Qwen3OmniThinkerVllm (``__new__``); ``inspect.signature``
    still shows the constructor's params, which the config checks and --model-path read."""
    import inspect

    from omnitrio._overrides import _takes_model_path
    from stages.qwen3_omni.thinker import Qwen3OmniThinker
    from stages.qwen3_omni.thinker_vllm import Qwen3OmniThinkerVllm

    params = inspect.signature(Qwen3OmniThinker).parameters
    assert {"model_path", "engine", "max_tokens"} <= set(params)
    assert "self" not in params
    assert "max_num_seqs" in inspect.signature(Qwen3OmniThinkerVllm).parameters
    config = omnitrio.load_config(VLLM_CONFIG)
    assert _takes_model_path(config)["thinker"] == "qwen3-omni"
    assert Qwen3OmniThinker.__new__(Qwen3OmniThinker, "t", engine="vllm").__class__ is (
        Qwen3OmniThinkerVllm
    )
    assert type(Qwen3OmniThinker.__new__(Qwen3OmniThinker, "t")) is Qwen3OmniThinker


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _engine_python_or_skip()
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("tiny-qwen3-omni-vllm")
    make_tiny_checkpoint(directory, seed=7)  # test_qwen3_omni.py's seed
    return directory


@pytest.fixture(scope="module")
def thinker(checkpoint: Path):  # type: ignore[no-untyped-def]
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    return Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
        checkpoint / "thinker"
    ).eval()


@pytest.fixture(scope="module")
def engine(checkpoint: Path):  # type: ignore[no-untyped-def]
    engine = VllmEngine.start(
        str(checkpoint), max_num_seqs=8, max_model_len=512, hidden_layers=[0, 1], audio=True
    )
    yield engine
    engine.close()


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (5, 31, 64, 12)]


def _run(engine: VllmEngine, prompts: list[list[int]], max_tokens: int, **add: object) -> dict:  # type: ignore[type-arg]
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    states: dict[str, object] = {}
    for index, prompt in enumerate(prompts):
        engine.add(str(index), prompt, max_tokens=max_tokens, **add)  # type: ignore[arg-type]
    for _ in range(max_tokens + 5):
        for out in engine.step():  # with any request added before, under its own id
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.states is not None:
                states[out.request_id] = out.states
        if all(len(t) >= max_tokens for t in tokens.values()):
            break
    return {"tokens": tokens, "states": states}


def _assert_equal_generate(thinker, tokens: dict[str, list[int]], **sampling: float) -> None:  # type: ignore[no-untyped-def]
    """Each of ``_prompts()``'s 16 greedy tokens (those run) equal transformers' generate's."""
    for index, prompt in enumerate(_prompts()[: len(tokens)]):
        ids = torch.tensor([prompt])
        expected = thinker.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            **sampling,
        )[0, len(prompt) :].tolist()
        assert tokens[str(index)] == expected, f"stream {index}"


def test_greedy_tokens_of_batched_streams_equal_generate(engine: VllmEngine, thinker) -> None:  # type: ignore[no-untyped-def]
    result = _run(engine, _prompts(), max_tokens=16)
    _assert_equal_generate(thinker, result["tokens"])
    assert engine.unfinished() == 0


def test_repetition_penalty_equals_generate(engine: VllmEngine, thinker) -> None:  # type: ignore[no-untyped-def]
    """vLLM's repetition penalty counts the prompt's tokens and the answer's, as generate's."""
    result = _run(engine, _prompts(), max_tokens=16, repetition_penalty=1.5)
    plain = _run(engine, _prompts(), max_tokens=16)
    assert result["tokens"] != plain["tokens"]  # the penalty changed the answers
    _assert_equal_generate(thinker, result["tokens"], repetition_penalty=1.5)


def test_prompt_hidden_states_equal_transformers(engine: VllmEngine, thinker) -> None:  # type: ignore[no-untyped-def]
    prompts = _prompts()
    result = _run(engine, prompts, max_tokens=2, prompt_states=True)
    worst = 0.0
    for index, prompt in enumerate(prompts):
        states = torch.from_numpy(result["states"][str(index)].copy())  # [2, S, H]
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = thinker(input_ids=ids, output_hidden_states=True)
        expected = torch.stack((out.hidden_states[0][0], out.hidden_states[1][0]))
        assert states.shape == expected.shape
        worst = max(worst, float((states - expected).abs().max()))
    print(f"vLLM vs transformers prompt hidden states: max abs difference {worst:.2e}")
    assert worst <= STATES_ATOL


def test_audio_beside_text_equals_transformers(
    engine: VllmEngine, thinker, checkpoint: Path
) -> None:  # type: ignore[no-untyped-def]
    """A prompt with audio, batched with text ones: vLLM's processor makes the features
    from the waveform and expands the one placeholder to the stage's count; the layer-0
    states at the audio positions (the audio encoder's, merged), the accept layer's and
    the greedy tokens equal transformers' given the torch thinker's features."""
    import numpy as np

    from stages.kit import one_placeholder
    from stages.qwen3_omni.thinker import Qwen3OmniThinker

    pcm = (np.random.default_rng(5).standard_normal(16_000) * 3000).astype("<i2")
    request = omnitrio.Request("hm?", audio=omnitrio.AudioInput(pcm.tobytes(), 16_000))
    stage = Qwen3OmniThinker(name="thinker", model_path=str(checkpoint))
    try:
        ids, features = stage._prompt(request)
        wave, audio_id, eos = stage._waveform(request), stage.audio_token_id, stage.eos_ids
        silence = omnitrio.Request("hm?", audio=omnitrio.AudioInput(bytes(32_000), 16_000))
        _, other_features = stage._prompt(silence)
    finally:
        stage.close()
    assert ids.count(audio_id) > 1
    engine.add(
        "heard",
        one_placeholder(ids, audio_id),
        max_tokens=16,
        prompt_states=True,
        audio=(wave, 16_000),
    )
    result = _run(engine, _prompts()[:2], max_tokens=16)  # batched beside the audio one
    heard = result["tokens"].pop("heard")  # up to <|im_end|>, where the engine stops
    _assert_equal_generate(thinker, result["tokens"])
    states = torch.from_numpy(result["states"]["heard"].copy())  # [2, S, H]
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = thinker(input_ids=input_ids, output_hidden_states=True, **features)
        other = thinker(input_ids=input_ids, output_hidden_states=True, **other_features)
        expected_tokens = thinker.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=16,
            eos_token_id=sorted(eos),
            do_sample=False,
            **features,
        )[0, len(ids) :].tolist()
    expected = torch.stack((out.hidden_states[0][0], out.hidden_states[1][0]))
    assert states.shape == expected.shape  # the placeholder expanded to the stage's count
    silent = torch.stack((other.hidden_states[0][0], other.hidden_states[1][0]))
    assert float((silent - expected).abs().max()) > 5 * AUDIO_STATES_ATOL  # other audio fails
    worst = float((states - expected).abs().max())
    print(f"vLLM vs transformers audio prompt states: max abs difference {worst:.2e}")
    assert worst <= AUDIO_STATES_ATOL
    assert heard == expected_tokens


def test_abort_mid_answer_frees_the_request_and_the_others_go_on(
    engine: VllmEngine, thinker
) -> None:  # type: ignore[no-untyped-def]
    prompts = _prompts()[:2]
    for index, prompt in enumerate(prompts):
        engine.add(f"abort-{index}", prompt, max_tokens=40)
    seen: dict[str, list[int]] = {"abort-0": [], "abort-1": []}
    for _ in range(4):
        for out in engine.step():
            seen[out.request_id].extend(out.new_token_ids)
    assert engine.unfinished() == 2
    engine.abort(["abort-0"])
    assert engine.unfinished() == 1  # freed at once, not at the end of its answer
    before = len(seen["abort-0"])
    while engine.unfinished():
        for out in engine.step():
            seen[out.request_id].extend(out.new_token_ids)
    assert len(seen["abort-0"]) == before
    assert len(seen["abort-1"]) == 40
    engine.abort(["abort-0", "never-added"])  # late or unknown aborts are no-ops


def test_a_refused_request_fails_alone(engine: VllmEngine) -> None:
    with pytest.raises(VllmRequestError, match="vLLM refused"):
        engine.add("too-long", list(range(200)) * 4, max_tokens=4)  # 800 > max_model_len 512
    result = _run(engine, _prompts()[:1], max_tokens=3)
    assert len(result["tokens"]["0"]) == 3


async def test_the_pipeline_with_the_thinker_on_vllm_equals_generate(
    checkpoint: Path, tmp_path: Path
) -> None:
    """configs/qwen3-omni-tiny-vllm.yaml, held-out prompts, four streams batched, one with
    audio (vLLM's multimodal path): text and codec frames equal transformers'
    generate(return_audio=True). It serves the checkpoint's top files split by
    `omnitrio split-checkpoint`, as a published checkpoint is: the engine loads the
    composite and builds its audio processor from the split's top."""
    import numpy as np
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from stages.qwen3_omni.thinker import Qwen3OmniThinker
    from stages.qwen3_omni.tiny import split_checkpoint
    from tests.stages.qwen3_omni.test_qwen3_omni import copy_composite, recorder_config

    split = tmp_path / "split"
    split_checkpoint(copy_composite(checkpoint, tmp_path / "published"), split)
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval()
    config = recorder_config(split)
    vllm_config = with_model_path(omnitrio.load_config(VLLM_CONFIG), split)
    stages = list(config.stages)
    stages[0] = vllm_config.stages[0]
    config = config.model_copy(update={"stages": tuple(stages)})
    options = {**GREEDY, "max_tokens": 10, "talker.max_tokens": 24}
    pcm = (np.random.default_rng(3).standard_normal(24_000) * 3000).astype("<i2")
    heard = omnitrio.Request(
        "what was that?", audio=omnitrio.AudioInput(pcm.tobytes(), 24_000), options=options
    )  # 1 s at 24 kHz: resampled to the encoder's 16 kHz, as on engine: torch
    requests = [omnitrio.Request(prompt, options=options) for prompt in HELD_OUT] + [heard]
    results = await run_streams(config, requests)
    for prompt, (text, frames, _) in zip(HELD_OUT, results[:3], strict=True):
        ref_text, ref_codes, _ = reference_run(reference, checkpoint, prompt, 10, 24)
        assert text == ref_text, prompt
        assert frames == frames_of(ref_codes), prompt
    # The reference gets the very prompt ids and features the torch thinker builds.
    torch_thinker = Qwen3OmniThinker(name="thinker", model_path=str(checkpoint))
    try:
        ids, features = torch_thinker._prompt(heard)
    finally:
        torch_thinker.close()
    assert ids.count(reference.config.thinker_config.audio_token_id) > 1
    ref_text, ref_codes, _ = reference_run(
        reference, checkpoint, "", 10, 24, input_ids=torch.tensor([ids]), **features
    )
    text, frames, _ = results[3]
    assert text == ref_text
    assert frames == frames_of(ref_codes)


def test_the_stage_aborts_a_closed_stream_and_fails_a_refused_one_alone(checkpoint: Path) -> None:
    """engine: vllm on the stage itself: open -> add, a step -> one engine step and one
    token per stream, close mid-answer -> abort (the engine frees it at once), a
    request vLLM refuses fails at open_stream, the others go on."""
    from omnitrio import StreamWork
    from stages.kit import OptionError
    from stages.qwen3_omni.thinker import Qwen3OmniThinker
    from stages.qwen3_omni.thinker_vllm import Qwen3OmniThinkerVllm

    stage = Qwen3OmniThinker(
        "thinker", model_path=str(checkpoint), engine="vllm", max_num_seqs=4, max_model_len=256
    )
    try:
        assert isinstance(stage, Qwen3OmniThinkerVllm)
        options = {"temperature": 0, "max_tokens": 30}
        audio = omnitrio.AudioInput(b"\x00\x01" * 8000, 16000)
        stage.audio_input = False  # as `audio_input: false` makes it
        with pytest.raises(OptionError, match=r"audio input is off here \(audio_input: false\)"):
            stage.open_stream("heard", omnitrio.Request("what did I say", audio=audio))
        stage.audio_input = True
        stage.open_stream("a", omnitrio.Request("first stream", options=options))
        stage.open_stream("b", omnitrio.Request("second stream", options=options))
        with pytest.raises(VllmRequestError):
            stage.open_stream("long", omnitrio.Request("x" * 400, options=options))
        work = [StreamWork("a", (), True), StreamWork("b", (), True)]
        for _ in range(3):
            outputs = stage.step(work)
        assert set(outputs) == {"a", "b"}
        assert stage.engine.unfinished() == 2
        stage.close_stream("a")  # closed (or cancelled) mid-answer
        assert stage.engine.unfinished() == 1
        for _ in range(3):
            stage.step(work[1:])
        assert stage.streams["b"].num_answer == 6
        # where an engine step's time goes: the stage's wait > LLMEngine.step() > forward
        stats = stage.stage_statistics()
        assert stats["engine_steps"] > 0
        assert 0 < stats["engine_forward_ms_mean"] < stats["engine_core_step_ms_mean"]
        assert stats["engine_core_step_ms_mean"] < stats["engine_step_ms_mean"]
    finally:
        stage.close()
