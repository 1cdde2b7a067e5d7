"""The Qwen2.5-Omni thinker on vLLM (engine: vllm): tokens, every token's hidden states,
aborts, refusals, and the pipeline (text and audio input) against transformers' generate.

Needs the engine's environment (``scripts/setup vllm``: .venv-vllm); without it the
engine tests skip, naming what is missing. Two engine processes in all: the stage's
(whose engine the token tests drive directly) and the pipeline's.
"""

from __future__ import annotations

import inspect
import pathlib

import pytest
import trio

import omnitrio
from tests.qwen2_5_omni_helpers import (
    VLLM_CONFIG,
    Output,
    Reference,
    collect_output,
    pcm_difference,
    split_published,
    tiny_checkpoint,  # noqa: F401 - a fixture
    tiny_config,
)

torch = pytest.importorskip("torch")

from omnitrio import StreamWork  # noqa: E402
from stages.kit import OptionError, Packager, VllmEngine, VllmRequestError  # noqa: E402
from stages.qwen2_5_omni.thinker import Qwen2_5OmniThinker  # noqa: E402
from tests.stages.qwen2_5_omni.test_qwen2_5_omni_parity import (  # noqa: E402
    CHUNKED,
    CHUNKED_MAX_ABS,
    CHUNKED_RMS,
    _requests,
)

STATES_ATOL = 1e-4


@pytest.fixture(scope="module")
def stage(tiny_checkpoint: pathlib.Path):  # type: ignore[no-untyped-def]  # noqa: F811
    from stages._vllm_engine import VllmUnavailable, engine_python

    try:
        engine_python()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    stage = Qwen2_5OmniThinker(
        "thinker",
        model_path=str(tiny_checkpoint),
        engine="vllm",
        max_num_seqs=8,
        max_model_len=256,
        kv_cache_bytes=1 << 28,
    )
    yield stage
    stage.close()


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: pathlib.Path):  # type: ignore[no-untyped-def]  # noqa: F811
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    return Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
        tiny_checkpoint / "thinker"
    ).eval()


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (5, 31, 64, 12)]


def test_greedy_tokens_and_every_tokens_hidden_states_equal_transformers(
    stage: Qwen2_5OmniThinker,
    thinker,  # type: ignore[no-untyped-def]
) -> None:
    """Four streams batched in the engine: 12 greedy tokens each equal to ``generate``'s,
    and the last hidden state of the prompt and of every fed answer token (what the
    talker reads) equal to transformers' ``output_hidden_states`` over the same ids."""
    engine: VllmEngine = stage.engine  # type: ignore[attr-defined]
    prompts, new = _prompts(), 12
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    rows: dict[str, list[object]] = {str(i): [] for i in range(len(prompts))}
    for index, prompt in enumerate(prompts):
        engine.add(str(index), prompt, max_tokens=new, ignore_eos=True, token_states=True)
    while engine.unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.states is not None:
                rows[out.request_id].append(torch.from_numpy(out.states[0].copy()))
    worst = 0.0
    for index, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        expected = thinker.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
        )[0, len(prompt) :].tolist()
        assert tokens[str(index)] == expected, f"stream {index}"
        fed = torch.tensor([prompt + expected[:-1]])  # the last token is never fed back
        with torch.no_grad():
            want = thinker(input_ids=fed, output_hidden_states=True).hidden_states[-1][0]
        got = torch.cat(rows[str(index)])  # type: ignore[arg-type]
        assert got.shape == want.shape, f"stream {index}"
        worst = max(worst, float((got - want).abs().max()))
    print(f"vLLM vs transformers last hidden states: max abs difference {worst:.2e}")
    assert worst <= STATES_ATOL


def test_the_stage_aborts_a_closed_stream_and_fails_a_refused_one_alone(
    stage: Qwen2_5OmniThinker,
) -> None:
    try:
        _abort_and_refuse(stage)
    finally:
        # The stage outlives this test (one engine start for the module); its packaging
        # thread must not (tests/conftest.py): close it, and give the stage a fresh one.
        stage.packager.close()
        stage.packager = Packager(stage.name, max_queued_jobs=8)


def _abort_and_refuse(stage: Qwen2_5OmniThinker) -> None:
    options = {"temperature": 0, "max_tokens": 30}
    stage.open_stream("a", omnitrio.Request("first stream", options=options))
    stage.open_stream("b", omnitrio.Request("second stream", options=options))
    with pytest.raises(VllmRequestError, match="vLLM refused"):
        stage.open_stream("long", omnitrio.Request("x" * 400, options=options))  # > 256
    work = [StreamWork("a", (), True), StreamWork("b", (), True)]
    for _ in range(3):
        outputs = stage.step(work)
    assert set(outputs) == {"a", "b"}
    assert stage.engine.unfinished() == 2  # type: ignore[attr-defined]
    stage.close_stream("a")  # closed (or cancelled) mid-answer
    assert stage.engine.unfinished() == 1  # type: ignore[attr-defined]  # freed at once
    for _ in range(3):
        stage.step(work[1:])
    assert stage.streams["b"].num_generated == 6
    stage.close_stream("b")
    assert stage.engine.unfinished() == 0  # type: ignore[attr-defined]


def test_audio_input_off_is_refused_by_name(stage: Qwen2_5OmniThinker) -> None:
    audio = omnitrio.AudioInput(b"\x00\x01" * 8000, 16000)
    stage.audio_input = False  # type: ignore[attr-defined]  # as `audio_input: false` makes it
    try:
        with pytest.raises(OptionError, match=r"audio input is off here \(audio_input: false\)"):
            stage.open_stream("heard", omnitrio.Request("what did I say", audio=audio))
    finally:
        stage.audio_input = True  # type: ignore[attr-defined]
    assert "heard" not in stage.streams


def test_the_engine_param_picks_the_class_and_is_checked(tmp_path: pathlib.Path) -> None:
    from stages.qwen2_5_omni.thinker_vllm import Qwen2_5OmniThinkerVllm

    with pytest.raises(OptionError, match="engine 'sglang' is not one of torch, vllm"):
        Qwen2_5OmniThinker("thinker", model_path=str(tmp_path), engine="sglang")
    with pytest.raises(OptionError, match="max_num_seqs apply to engine: vllm only"):
        Qwen2_5OmniThinker("thinker", model_path=str(tmp_path), max_num_seqs=4)
    params = inspect.signature(Qwen2_5OmniThinker).parameters
    assert {"model_path", "engine", "max_tokens"} <= set(params)
    assert "max_num_seqs" in inspect.signature(Qwen2_5OmniThinkerVllm).parameters
    made = Qwen2_5OmniThinker.__new__(Qwen2_5OmniThinker, "t", engine="vllm")
    assert type(made) is Qwen2_5OmniThinkerVllm
    assert type(Qwen2_5OmniThinker.__new__(Qwen2_5OmniThinker, "t")) is Qwen2_5OmniThinker


async def test_the_pipeline_with_the_thinker_on_vllm_equals_generate(
    stage: Qwen2_5OmniThinker,  # only for its skip: the pipeline starts its own engine
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    tmp_path: pathlib.Path,
) -> None:
    """configs/qwen2.5-omni-tiny-vllm.yaml, five streams at once, one with audio: text ids,
    codec codes and the waveform equal transformers' generate(return_audio=True), as on
    engine: torch. It serves the checkpoint's top files split by `omnitrio
    split-checkpoint`, as a published checkpoint is: the audio input needs what the split
    keeps at the top (the processor config, the tokenizer's media tokens)."""
    config = tiny_config(
        split_published(tiny_checkpoint, tmp_path),
        source=VLLM_CONFIG,
        thinker={"emit_ids": True, "max_num_seqs": 8, "kv_cache_bytes": 1 << 28},
        talker={"emit_codes": True},
        token2wav=CHUNKED,
    )
    cases = _requests()[:5]  # the fourth has audio: vLLM's multimodal path
    requests = [case[0] for case in cases]
    assert requests[3].audio is not None
    got: dict[int, Output] = {}
    async with omnitrio.open_pipeline(config) as pipeline:
        assert pipeline.config.stages[0].params["engine"] == "vllm"

        async def one(index: int) -> None:
            async with pipeline.open_stream(requests[index]) as stream:
                got[index] = collect_output([item async for item in stream])

        async with trio.open_nursery() as nursery:
            for index in range(len(requests)):
                nursery.start_soon(one, index)
        batched = pipeline.statistics().stages["thinker"].model["largest_decode_batch_size"]
    assert batched > 1  # the engine stepped streams together
    reference = Reference(tiny_checkpoint)
    worst_abs = worst_rms = 0.0
    for index, (request, t, c, seed) in enumerate(cases):
        want = reference.run(request, thinker_max_tokens=t, talker_max_tokens=c, seed=seed)
        output = got[index]
        assert (output.text_ids, output.text) == (want.text_ids, want.text), request.text
        assert output.codes == want.codes, request.text
        max_abs, rms = pcm_difference(output.pcm16, want.pcm16)
        worst_abs, worst_rms = max(worst_abs, max_abs), max(worst_rms, rms)
    assert worst_abs <= CHUNKED_MAX_ABS
    assert worst_rms <= CHUNKED_RMS
