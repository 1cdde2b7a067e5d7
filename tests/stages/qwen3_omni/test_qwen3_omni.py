"""Qwen3-Omni stages against transformers' own ``generate(return_audio=True)`` (invariant 7).

One tiny random-init checkpoint (``make_tiny_checkpoint``) serves every test.
Greedy decoding everywhere: the pipelined, batched, chunked run must produce the
reference's text and codec codes exactly, for one stream and for 8 concurrent
streams of different prompts and lengths.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import trio

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoTokenizer,
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeForConditionalGeneration,
)

import omnitrio  # noqa: E402
from omnitrio._overrides import with_model_path  # noqa: E402
from stages._torch_loading import WeightsError, load_pretrained  # noqa: E402
from stages.qwen3_omni.code2wav import decode_window  # noqa: E402
from stages.qwen3_omni.thinker import Qwen3OmniThinker  # noqa: E402
from stages.qwen3_omni.tiny import make_tiny_checkpoint  # noqa: E402

# transformers' own generate() warns about its talker call; that is the reference's business.
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`")

GREEDY = {"temperature": 0, "talker.temperature": 0}
CONFIG = Path(__file__).resolve().parents[3] / "configs" / "qwen3-omni-tiny.yaml"
# Parity runs on every device present: the GPU cases skip, saying why, without one.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(),
            reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
        ),
    ),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("tiny-qwen3-omni")
    # seed 7: with the thinker's head size 32 (vLLM's minimum), its talker runs to the
    # 40-token limit below on "hello there", and generate() takes its audio prompt
    make_tiny_checkpoint(directory, seed=7)
    return directory


@pytest.fixture(scope="module")
def reference(checkpoint: Path):  # type: ignore[no-untyped-def]
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval()


@pytest.fixture(scope="module", params=DEVICES)
def device_reference(request: pytest.FixtureRequest, checkpoint: Path):  # type: ignore[no-untyped-def]
    """(device, the reference model on it)."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval()
    return request.param, model.to(request.param)


def reference_run(model, checkpoint: Path, prompt: str, max_tokens: int, max_frames: int, **extra):  # type: ignore[no-untyped-def]
    """Reference answer text, codec codes [G, T] and waveform of ``generate``."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    input_ids = extra.pop("input_ids", None)
    if input_ids is None:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        input_ids = torch.tensor([tokenizer(text)["input_ids"]])
    input_ids = input_ids.to(model.device)
    captured = []
    decode = model.code2wav.chunked_decode

    def capture(codes, **kwargs):  # type: ignore[no-untyped-def]
        captured.append(codes.clone())
        return decode(codes, **kwargs)

    model.code2wav.chunked_decode = capture
    try:
        sequences, wav = model.generate(
            input_ids,
            thinker_max_new_tokens=max_tokens,
            thinker_do_sample=False,
            thinker_eos_token_id=tokenizer.eos_token_id,
            talker_do_sample=False,
            talker_max_new_tokens=max_frames,
            **extra,
        )
    finally:
        del model.code2wav.chunked_decode
    answer = tokenizer.decode(sequences[0, input_ids.shape[1] :], skip_special_tokens=True)
    return answer, captured[0][0].cpu(), wav.reshape(-1).cpu()


def on_device(config: omnitrio.PipelineConfig, device: str) -> omnitrio.PipelineConfig:
    """Every stage of ``config`` on ``device``."""
    stages = tuple(spec.model_copy(update={"device": device}) for spec in config.stages)
    return config.model_copy(update={"stages": stages})


def recorder_config(checkpoint: Path, device: str = "cpu") -> omnitrio.PipelineConfig:
    """The tiny pipeline with code2wav swapped for a stage that shows each codec frame."""
    config = with_model_path(omnitrio.load_config(CONFIG), checkpoint)
    stages = list(config.stages)
    stages[2] = stages[2].model_copy(
        update={"impl": "tests.codec_recorder:CodecRecorder", "params": {}}
    )
    return on_device(config.model_copy(update={"stages": tuple(stages)}), device)


async def run_streams(config, requests, statistics=None):  # type: ignore[no-untyped-def]
    """Run ``requests`` concurrently; per request: (text, frames, audio samples).
    ``statistics`` (a list) gets the pipeline's statistics at the end."""
    results: dict[int, tuple[str, list[tuple[int, ...]], np.ndarray]] = {}

    async def one(index: int, request: omnitrio.Request) -> None:
        text, frames, audio = "", [], b""
        async with pipeline.open_stream(request) as stream:
            async for item in stream:
                if isinstance(item, omnitrio.TextDelta):
                    text += item.text
                elif isinstance(item, omnitrio.Event) and item.name == "codec_frame":
                    frames.append(item.data["codes"])
                elif isinstance(item, omnitrio.AudioChunk):
                    audio += item.pcm16
        results[index] = (text, frames, np.frombuffer(audio, dtype="<i2"))

    async with omnitrio.open_pipeline(config) as pipeline:
        async with trio.open_nursery() as nursery:
            for index, request in enumerate(requests):
                nursery.start_soon(one, index, request)
        if statistics is not None:
            statistics.append(pipeline.statistics())
    return [results[i] for i in range(len(requests))]


def frames_of(codes: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(int(c) for c in column) for column in codes.T]


async def test_one_stream_matches_generate(checkpoint: Path, device_reference) -> None:  # type: ignore[no-untyped-def]
    device, reference = device_reference
    options = {**GREEDY, "max_tokens": 12, "talker.max_tokens": 40}
    [(text, frames, _)] = await run_streams(
        recorder_config(checkpoint, device), [omnitrio.Request("hello there", options=options)]
    )
    ref_text, ref_codes, _ = reference_run(reference, checkpoint, "hello there", 12, 40)
    assert text == ref_text
    assert frames == frames_of(ref_codes)
    assert len(frames) == 39  # 40 talker tokens, the last one's residual codes never drawn


async def test_eight_concurrent_streams_each_match_generate(
    checkpoint: Path, device_reference
) -> None:  # type: ignore[no-untyped-def]
    device, reference = device_reference
    prompts = [
        "hi",
        "hello there",
        "what is the capital of france?",
        "tell me a story about a dragon who learned to sing",
        "ok",
        "the quick brown fox jumps over the lazy dog",
        "1 2 3",
        "why is the sky blue? please answer briefly.",
    ]
    lengths = [(4 + 3 * i, 10 + 7 * i) for i in range(len(prompts))]  # (tokens, talker tokens)
    requests = [
        omnitrio.Request(p, options={**GREEDY, "max_tokens": t, "talker.max_tokens": f})
        for p, (t, f) in zip(prompts, lengths, strict=True)
    ]
    statistics: list[omnitrio.PipelineStatistics] = []
    results = await run_streams(recorder_config(checkpoint, device), requests, statistics)
    # They really ran batched: one forward served several streams.
    assert statistics[0].stages["thinker"].largest_batch_size > 1
    assert statistics[0].stages["talker"].largest_batch_size > 1
    assert statistics[0].stages["thinker"].model["kv_bytes"] == 0  # every stream's KV freed
    for prompt, (tokens, talker_tokens), (text, frames, _) in zip(
        prompts, lengths, results, strict=True
    ):
        ref_text, ref_codes, _ = reference_run(reference, checkpoint, prompt, tokens, talker_tokens)
        assert text == ref_text, prompt
        assert frames == frames_of(ref_codes), prompt


async def test_audio_input_matches_generate(checkpoint: Path, reference) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal(16_000) * 3000).astype("<i2").tobytes()  # 1 s at 16 kHz
    request = omnitrio.Request(
        "what did you hear?",
        audio=omnitrio.AudioInput(pcm, 16_000),
        options={**GREEDY, "max_tokens": 8, "talker.max_tokens": 20},
    )
    [(text, frames, _)] = await run_streams(recorder_config(checkpoint), [request])
    # The reference gets the very prompt ids and features the thinker stage builds.
    thinker = Qwen3OmniThinker(name="thinker", model_path=str(checkpoint))
    try:
        ids, features = thinker._prompt(request)
    finally:
        thinker.close()
    assert ids.count(reference.config.thinker_config.audio_token_id) > 0
    ref_text, ref_codes, _ = reference_run(
        reference, checkpoint, "", 8, 20, input_ids=torch.tensor([ids]), **features
    )
    assert text == ref_text
    assert frames == frames_of(ref_codes)


def test_audio_at_another_rate_goes_through_the_one_resampler(checkpoint: Path) -> None:
    """48 kHz input is brought to the encoder's 16 kHz by omnitrio's resampler (soxr,
    anti-aliased): a 14 kHz tone, which linear interpolation folds down to 2 kHz, is
    filtered out, so the features equal those of the same audio resampled by the client."""
    seconds = np.arange(48_000) / 48_000
    rng = np.random.default_rng(1)
    wave = 0.3 * np.sin(2 * np.pi * 14_000 * seconds) + 0.05 * rng.standard_normal(48_000)
    pcm_48k = (wave * 32767).astype("<i2")
    at_16k = omnitrio.resample_float(pcm_48k.astype(np.float32) / 32768.0, 48_000, 16_000)
    pcm_16k = (np.clip(at_16k, -1, 1) * 32768.0).round().clip(-32768, 32767).astype("<i2")
    thinker = Qwen3OmniThinker(name="thinker", model_path=str(checkpoint))
    try:
        _, features_48k = thinker._prompt(
            omnitrio.Request("hi", audio=omnitrio.AudioInput(pcm_48k.tobytes(), 48_000))
        )
        _, features_16k = thinker._prompt(
            omnitrio.Request("hi", audio=omnitrio.AudioInput(pcm_16k.tobytes(), 16_000))
        )
    finally:
        thinker.close()
    mels_48k, mels_16k = features_48k["input_features"], features_16k["input_features"]
    assert mels_48k.shape == mels_16k.shape
    # Only the PCM16 rounding of the client's copy differs.
    assert torch.allclose(mels_48k, mels_16k, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
async def test_full_pipeline_streams_audio_chunks(checkpoint: Path, device: str) -> None:
    config = on_device(with_model_path(omnitrio.load_config(CONFIG), checkpoint), device)
    options = {**GREEDY, "max_tokens": 6, "talker.max_tokens": 40}
    [(text, _, audio)] = await run_streams(config, [omnitrio.Request("hello", options=options)])
    assert text
    # n frames in windows of 4, then 25 at a time: each window's causal decoder drops
    # a fixed tail of samples, as the model's own chunked decode does per chunk.
    code2wav = Qwen3OmniMoeCode2Wav.from_pretrained(checkpoint / "code2wav")
    lost = 39 * 1920 - code2wav(torch.zeros((1, 8, 39), dtype=torch.long)).shape[-1]
    lengths = {n * 1920 - (1 + -(-(n - 4) // 25)) * lost: n for n in range(5, 40)}
    assert len(audio) in lengths


def test_windowed_decode_equals_reference_chunked_decode(checkpoint: Path, reference) -> None:  # type: ignore[no-untyped-def]
    _, codes, wav = reference_run(reference, checkpoint, "hello there", 12, 60)
    frames = list(codes.T)
    model = reference.code2wav
    # Same windows as the reference's own chunked decode: identical samples.
    ours = torch.cat(
        [
            decode_window(model, frames, s, min(s + 25, len(frames)), 25)
            for s in range(0, len(frames), 25)
        ]
    )
    theirs = model.chunked_decode(codes[None], chunk_size=25, left_context_size=25)[0, 0]
    assert torch.equal(ours, theirs)
    # The stage's default (a 4-frame first window) against generate's single window:
    # equal where both decode the same frames with full context; shorter by the
    # decoder's per-window tail.
    starts = [0, 4, *range(29, len(frames), 25)]
    windows = [
        decode_window(model, frames, s, min(e, len(frames)), 25)
        for s, e in zip(starts, [*starts[1:], len(frames)], strict=True)
    ]
    assert all(torch.isfinite(w).all() for w in windows)
    assert sum(len(w) for w in windows) < len(wav)


def test_missing_weights_name_the_stage_and_keys(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "talker"
    broken.mkdir()
    (broken / "config.json").write_text((checkpoint / "talker" / "config.json").read_text())
    weights = load_file(checkpoint / "talker" / "model.safetensors")
    dropped = sorted(k for k in weights if "code_predictor" in k)[0]
    del weights[dropped]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    from transformers import Qwen3OmniMoeTalkerForConditionalGeneration

    with pytest.raises(WeightsError, match=r"stage 'talker'.*missing keys: .*code_predictor"):
        load_pretrained(Qwen3OmniMoeTalkerForConditionalGeneration, broken, stage="talker")


def test_a_model_id_says_how_to_give_a_local_folder() -> None:
    with pytest.raises(WeightsError, match=r"never downloads weights.*--model-path"):
        Qwen3OmniThinker(name="thinker", model_path="Qwen/Qwen3-Omni-30B-A3B-Instruct")


def test_slow_packaging_does_not_hold_back_the_steps(checkpoint: Path) -> None:
    """With packaging stalled, the thinker still samples step after step (up to its
    packaging queue); once packaging resumes every token is delivered, in order."""
    thinker = Qwen3OmniThinker(
        name="thinker", model_path=str(checkpoint), max_tokens=10, packaging_queue=4
    )
    release = threading.Event()
    pack = thinker._pack

    def stalled_pack(*args):  # type: ignore[no-untyped-def]
        release.wait(timeout=30)
        return pack(*args)

    thinker._pack = stalled_pack  # type: ignore[method-assign]
    try:
        thinker.open_stream("s", omnitrio.Request("hello", options={"temperature": 0}))
        work = [omnitrio.StreamWork("s", (), True)]
        early = [thinker.step(work)["s"] for _ in range(5)]  # 1 running + 4 queued jobs
        assert all(not out.visible and not out.payloads for out in early)
        assert thinker.streams["s"].num_answer == 5  # sampled regardless
        release.set()
        outputs = []
        while not (outputs and outputs[-1].done):
            outputs.append(thinker.step(work)["s"])
        payloads = [p for out in outputs for p in out.payloads]
        assert len(payloads) == 10
        assert [getattr(p, "index", 0) for p in payloads] == list(range(10))
    finally:
        release.set()
        thinker.close()


async def test_a_bad_option_fails_only_that_stream_naming_the_option(checkpoint: Path) -> None:
    config = with_model_path(omnitrio.load_config(CONFIG), checkpoint)
    async with omnitrio.open_pipeline(config) as pipeline:
        bad = omnitrio.Request("hi", options={"thinker.temperature": "hot"})
        with pytest.raises(omnitrio.StageError, match=r"'thinker'.*option 'thinker.temperature'"):
            async with pipeline.open_stream(bad) as stream:
                [item async for item in stream]
        unknown_speaker = omnitrio.Request("hi", options={"speaker": "nobody"})
        with pytest.raises(omnitrio.StageError, match=r"'talker'.*unknown speaker 'nobody'"):
            async with pipeline.open_stream(unknown_speaker) as stream:
                [item async for item in stream]
        fine = omnitrio.Request("hi", options={**GREEDY, "max_tokens": 3, "talker.max_tokens": 6})
        async with pipeline.open_stream(fine) as stream:
            assert [item async for item in stream]


async def test_sampling_is_per_stream_and_seeded(checkpoint: Path) -> None:
    def request(seed: int) -> omnitrio.Request:
        options = {
            "temperature": 1.0,
            "top_k": 50,
            "seed": seed,
            "talker.temperature": 1.0,
            "talker.seed": seed,
            "max_tokens": 16,
            "talker.max_tokens": 12,
        }
        return omnitrio.Request("hello there", options=options)

    results = await run_streams(
        recorder_config(checkpoint), [request(1), request(1), request(2), request(3)]
    )
    assert results[0][:2] == results[1][:2]  # same seed, run concurrently: same answer
    assert len({r[0] for r in results}) > 1  # other seeds: other answers


async def test_cancelling_mid_answer_frees_every_stage(checkpoint: Path) -> None:
    config = with_model_path(omnitrio.load_config(CONFIG), checkpoint)
    options = {**GREEDY, "max_tokens": 200, "talker.max_tokens": 400}
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream(omnitrio.Request("hello", options=options)) as stream:
            async for item in stream:
                if isinstance(item, omnitrio.AudioChunk):
                    break  # leave mid-answer: the stream is cancelled
        stats = pipeline.statistics()
        assert stats.num_cancelled == 1
        for name in ("thinker", "talker", "code2wav"):
            assert stats.stages[name].num_open_streams == 0
            assert stats.stages[name].model["num_active_streams"] == 0
        assert stats.stages["thinker"].model["kv_bytes"] == 0
        assert stats.stages["talker"].model["kv_bytes"] == 0


def test_make_tiny_model_command(tmp_path: Path) -> None:
    from omnitrio._cli import main

    assert main(["make-tiny-model", str(tmp_path / "m"), "--seed", "3"]) == 0
    for part in ("thinker", "talker", "code2wav"):
        assert (tmp_path / "m" / part / "model.safetensors").is_file()
    assert (tmp_path / "m" / "thinker" / "tokenizer.json").is_file()
    assert (tmp_path / "m" / "thinker" / "preprocessor_config.json").is_file()


def copy_composite(checkpoint: Path, composite: Path) -> Path:
    """The composite's own files, without the stage folders: a published checkpoint."""
    composite.mkdir()
    for file in checkpoint.iterdir():
        if file.is_file():
            (composite / file.name).write_bytes(file.read_bytes())
    return composite


async def test_a_published_checkpoint_is_split_then_served(
    checkpoint: Path, tmp_path: Path
) -> None:
    from omnitrio._cli import main

    composite = copy_composite(checkpoint, tmp_path / "published")
    with pytest.raises(WeightsError, match="omnitrio split-checkpoint"):
        Qwen3OmniThinker(name="thinker", model_path=str(composite))
    assert main(["split-checkpoint", str(composite), str(tmp_path / "split")]) == 0
    for name in ("model.safetensors", "config.json", "tokenizer_config.json"):
        # the composite stays at the top: the thinker on vLLM loads it there
        assert (tmp_path / "split" / name).read_bytes() == (composite / name).read_bytes()
    options = {**GREEDY, "max_tokens": 6, "talker.max_tokens": 10}
    request = omnitrio.Request("hello there", options=options)
    [ours] = await run_streams(recorder_config(tmp_path / "split"), [request])
    [original] = await run_streams(recorder_config(checkpoint), [request])
    assert ours[:2] == original[:2]


# -- fault injection on the real stages (stages/faults.py) -----------------------------


def faulty_config(
    checkpoint: Path, stage: str, step_timeout_s: float = 120
) -> omnitrio.PipelineConfig:
    """The recorder pipeline with ``stage`` wrapped in a FaultInjector."""
    config = recorder_config(checkpoint)
    stages = tuple(
        spec.model_copy(
            update={
                "impl": "stages.faults:FaultInjector",
                "params": {"impl": spec.impl, "params": spec.params},
                "step_timeout_s": step_timeout_s,
            }
        )
        if spec.name == stage
        else spec
        for spec in config.stages
    )
    return config.model_copy(update={"stages": stages})


async def run_outcomes(config, requests):  # type: ignore[no-untyped-def]
    """Like run_streams, but a stream's StageError is its result instead of raising."""
    results: dict[int, object] = {}

    async def one(index: int, request: omnitrio.Request) -> None:
        text, frames = "", []
        try:
            async with pipeline.open_stream(request) as stream:
                async for item in stream:
                    if isinstance(item, omnitrio.TextDelta):
                        text += item.text
                    elif isinstance(item, omnitrio.Event):
                        frames.append(item.data["codes"])
        except omnitrio.StageError as error:
            results[index] = error
        else:
            results[index] = (text, frames)

    async with omnitrio.open_pipeline(config) as pipeline:
        async with trio.open_nursery() as nursery:
            for index, request in enumerate(requests):
                nursery.start_soon(one, index, request)
        statistics = pipeline.statistics()
    return [results[i] for i in range(len(requests))], statistics


def greedy(prompt: str, **faults: float) -> omnitrio.Request:
    options = {**GREEDY, "max_tokens": 8, "talker.max_tokens": 16}
    return omnitrio.Request(
        prompt, options={**options, **{f"fault.{k}": v for k, v in faults.items()}}
    )


async def test_one_streams_talker_failure_leaves_the_others_exact(
    checkpoint: Path, reference
) -> None:  # type: ignore[no-untyped-def]
    prompts = ["hi", "hello there", "why is the sky blue?", "ok"]
    requests = [
        greedy(p, stream_error_at=3) if i == 1 else greedy(p) for i, p in enumerate(prompts)
    ]
    results, statistics = await run_outcomes(faulty_config(checkpoint, "talker"), requests)
    failed = results[1]
    assert isinstance(failed, omnitrio.StageError)
    assert failed.stage == "talker"
    assert "InjectedFault" in str(failed)
    for index in (0, 2, 3):  # batched with the failing stream, still exactly the reference
        ref_text, ref_codes, _ = reference_run(reference, checkpoint, prompts[index], 8, 16)
        assert results[index] == (ref_text, frames_of(ref_codes))
    assert statistics.num_failed == 1
    assert statistics.stages["talker"].model["kv_bytes"] == 0


async def test_a_raising_thinker_step_fails_its_batch_and_the_stage_serves_on(
    checkpoint: Path,
    reference,  # type: ignore[no-untyped-def]
) -> None:
    config = faulty_config(checkpoint, "thinker")
    async with omnitrio.open_pipeline(config) as pipeline:
        with pytest.raises(omnitrio.StageError, match=r"stage 'thinker'.*InjectedFault"):
            async with pipeline.open_stream(greedy("hi", step_raise_at=2)) as stream:
                [item async for item in stream]
        assert pipeline.statistics().stages["thinker"].num_step_failures == 1
    # The same pipeline config, next stream: unaffected and exact.
    results, _ = await run_outcomes(config, [greedy("hello there")])
    ref_text, ref_codes, _ = reference_run(reference, checkpoint, "hello there", 8, 16)
    assert results[0] == (ref_text, frames_of(ref_codes))


async def test_a_hung_talker_is_reported_with_its_streams(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = faulty_config(checkpoint, "talker", step_timeout_s=0.5)
    results, statistics = await run_outcomes(config, [greedy("hi", hang_at=2, hang_s=2.0)])
    assert isinstance(results[0], omnitrio.StageError)
    assert results[0].stage == "talker"
    assert "step did not return within" in str(results[0])
    assert statistics.stages["talker"].hung
    hung = [r.getMessage() for r in caplog.records if "is hung" in r.getMessage()]
    assert hung
    assert "streams in flight: s0" in hung[0]


def test_a_tiny_checkpoint_is_a_function_of_its_seed(checkpoint: Path, tmp_path: Path) -> None:
    """Every weight comes from the seeded generator (none is left as uninitialised memory)."""
    from safetensors.torch import load_file

    scratch = [torch.full((256, 256), float("nan")) for _ in range(8)]  # dirty the allocator
    del scratch
    make_tiny_checkpoint(tmp_path / "again", seed=7)  # the fixture's seed
    first = load_file(checkpoint / "model.safetensors")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == again.keys()
    for key, tensor in first.items():
        assert torch.equal(tensor, again[key]), key
        assert torch.isfinite(tensor).all(), key
        if tensor.dim() == 2 and "experts" in key:
            assert tensor.std() > 1e-3, key  # drawn, not left at ~0


async def test_a_text_only_request_skips_the_talker_and_keeps_all_its_text(
    checkpoint: Path,
    reference,  # type: ignore[no-untyped-def]
) -> None:
    config = with_model_path(omnitrio.load_config(CONFIG), checkpoint)
    options = {**GREEDY, "max_tokens": 12, "modalities": "text"}
    statistics: list[omnitrio.PipelineStatistics] = []
    [(text, _, audio)] = await run_streams(
        config, [omnitrio.Request("hello there", options=options)], statistics
    )
    ref_text, _, _ = reference_run(reference, checkpoint, "hello there", 12, 4)
    assert text == ref_text
    assert len(audio) == 0
    assert statistics[0].stages["talker"].model["num_tokens"] == 0


def test_the_server_serves_the_tiny_model_to_the_openai_sdk(checkpoint: Path) -> None:
    import base64

    import openai

    from tests.server.test_server_process import start_server

    process, base_url = start_server(
        "--config", str(CONFIG), "--model-path", str(checkpoint), "--port", "0"
    )
    try:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        # The talker samples as generate() does (temperature 0.9), and a random-init
        # talker unseeded sometimes draws the codec's end first (no audio). Seeded by the
        # request's seed (OpenAI's), it answers the same every time: seed 1 gives this
        # checkpoint's talker ~9.5 s of audio (seeds 0-11: 0.2-9.5 s), far from its end.
        stream = client.chat.completions.create(
            model="qwen3-omni-tiny",
            messages=[{"role": "user", "content": "hello there"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},
            max_tokens=8,
            temperature=0,
            seed=1,
            stream=True,
        )
        transcript, audio = "", b""
        for chunk in stream:
            delta = chunk.choices[0].delta
            if delta.audio is not None:
                transcript += delta.audio.transcript or ""
                audio += base64.b64decode(delta.audio.data or "")
        assert transcript
        assert len(audio) > 2 * 24_000 * 2, len(audio)  # over 2 s of 24 kHz PCM16
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
