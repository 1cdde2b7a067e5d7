"""Qwen3-Omni stages and their device: payloads stay where they were made, a model in
memory serves the stages and ``generate`` alike, clear errors for a device or fast
path the machine cannot run. The CUDA cases skip without a GPU, saying why."""

# ruff: noqa: F811  (the checkpoint fixture is imported from test_qwen3_omni)
from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoTokenizer,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)

import omnitrio  # noqa: E402
from stages._torch_device import DeviceError  # noqa: E402
from stages._torch_loading import WeightsError  # noqa: E402
from stages.qwen3_omni.code2wav import Qwen3OmniCode2Wav  # noqa: E402
from stages.qwen3_omni.fast_paths import FastPathError  # noqa: E402
from stages.qwen3_omni.payloads import CodecFrame, TalkerPrompt, TextToken  # noqa: E402
from stages.qwen3_omni.talker import Qwen3OmniTalker  # noqa: E402
from stages.qwen3_omni.thinker import Qwen3OmniThinker  # noqa: E402
from stages.qwen3_omni.weights import (  # noqa: E402
    LiveModel,
    register_live_model,
    unregister_live_model,
)
from tests.stages.qwen3_omni.test_qwen3_omni import (  # noqa: E402
    DEVICES,
    GREEDY,
    checkpoint,  # noqa: F401 - a fixture
    frames_of,
    recorder_config,
    reference_run,
    run_streams,
)

NO_CUDA = not torch.cuda.is_available()
# transformers' own generate() warns about its talker call; that is the reference's business.
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`")


def run_to_end(stage, stream_id: str, inputs=()) -> list[object]:  # type: ignore[no-untyped-def]
    """Step one stream through ``stage`` until done; every payload it sent."""
    payloads: list[object] = []
    work = [omnitrio.StreamWork(stream_id, tuple(inputs), True)]
    for _ in range(200):
        out = stage.step(work)[stream_id]
        payloads += out.payloads
        if out.done:
            return payloads
        work = [omnitrio.StreamWork(stream_id, (), True)]
    raise AssertionError("the stage did not finish")


@pytest.mark.parametrize("device", DEVICES)
def test_payloads_carry_the_stage_device_tensors(checkpoint: Path, device: str) -> None:
    """thinker -> talker -> code2wav on one device: every payload tensor is on it (no host
    round trip between stages); only the audio comes back to the host."""
    request = omnitrio.Request("hello there", options={**GREEDY, "max_tokens": 5})
    thinker = Qwen3OmniThinker(name="thinker", device=device, model_path=str(checkpoint))
    talker = Qwen3OmniTalker(name="talker", device=device, model_path=str(checkpoint))
    code2wav = Qwen3OmniCode2Wav(name="code2wav", device=device, model_path=str(checkpoint))
    try:
        thinker.open_stream("s", request)
        to_talker = run_to_end(thinker, "s")
        prompt = to_talker[0]
        assert isinstance(prompt, TalkerPrompt)
        tensors = [prompt.user_vectors, prompt.assistant_vectors, prompt.special_vectors]
        tensors += [prompt.user_ids, prompt.user_multimodal]
        tensors += [item.vector for item in to_talker[1:] if isinstance(item, TextToken)]
        assert {t.device.type for t in tensors} == {device}
        talker.open_stream("s", omnitrio.Request("", options={**GREEDY, "talker.max_tokens": 9}))
        frames = run_to_end(talker, "s", to_talker)
        assert frames
        assert all(isinstance(f, CodecFrame) for f in frames)
        assert {f.codes.device.type for f in frames} == {device}  # type: ignore[attr-defined]
        code2wav.open_stream("s", request)
        out = code2wav.step([omnitrio.StreamWork("s", tuple(frames), True)])["s"]
        assert out.visible
        assert isinstance(out.visible[0], omnitrio.AudioChunk)
    finally:
        thinker.close()
        talker.close()


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("stage", [Qwen3OmniThinker, Qwen3OmniTalker, Qwen3OmniCode2Wav])
def test_cuda_without_a_gpu_is_refused_naming_the_stage(checkpoint: Path, stage) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DeviceError, match=r"stage 'x': device 'cuda' needs a CUDA GPU"):
        stage(name="x", device="cuda", model_path=str(checkpoint))


def test_an_unknown_device_is_refused(checkpoint: Path) -> None:
    with pytest.raises(DeviceError, match=r"stage 'x': device 'gpu0' is not a torch device"):
        Qwen3OmniTalker(name="x", device="gpu0", model_path=str(checkpoint))


def test_a_fast_path_the_device_cannot_run_is_refused(checkpoint: Path) -> None:
    with pytest.raises(FastPathError, match="'warp' is not one of off, compile, cuda-graphs"):
        Qwen3OmniThinker(name="x", model_path=str(checkpoint), decode_fast_path="warp")
    with pytest.raises(FastPathError, match="'cuda-graphs' needs device: cuda"):
        Qwen3OmniTalker(name="x", model_path=str(checkpoint), decode_fast_path="cuda-graphs")


def live_config(checkpoint: Path, device: str, name: str) -> omnitrio.PipelineConfig:
    """The recorder pipeline with its model stages reading the live model ``name``."""
    config = recorder_config(checkpoint, device)
    stages = []
    for spec in config.stages:
        params = {k: v for k, v in spec.params.items() if k != "model_path"}
        if spec.name != "code2wav":
            params["live_model"] = name
        stages.append(spec.model_copy(update={"params": params}))
    return config.model_copy(update={"stages": tuple(stages)})


@pytest.mark.parametrize("device", DEVICES)
async def test_a_live_model_serves_the_stages_and_generate_alike(
    checkpoint: Path, device: str
) -> None:
    """One model in memory (no folder per stage) behind both the pipeline and generate."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval().to(device)
    live = LiveModel(
        model,
        AutoTokenizer.from_pretrained(checkpoint),
        WhisperFeatureExtractor.from_pretrained(checkpoint),
    )
    register_live_model("tiny-live", live)
    try:
        options = {**GREEDY, "max_tokens": 10, "talker.max_tokens": 24}
        [(text, frames, _)] = await run_streams(
            live_config(checkpoint, device, "tiny-live"),
            [omnitrio.Request("hello there", options=options)],
        )
    finally:
        unregister_live_model("tiny-live")
    ref_text, ref_codes, _ = reference_run(model, checkpoint, "hello there", 10, 24)
    assert text == ref_text
    assert frames == frames_of(ref_codes)


def test_a_live_model_must_be_registered_and_on_the_stage_device(checkpoint: Path) -> None:
    with pytest.raises(WeightsError, match=r"no live model 'nowhere' is registered"):
        Qwen3OmniTalker(name="talker", live_model="nowhere")
    with pytest.raises(WeightsError, match="exactly one of model_path"):
        Qwen3OmniTalker(name="talker", model_path=str(checkpoint), live_model="x")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval()
    register_live_model("meta-live", LiveModel(model.to("meta"), None, None))  # type: ignore[arg-type]
    try:
        with pytest.raises(DeviceError, match=r"live model 'meta-live' is on meta"):
            Qwen3OmniTalker(name="talker", live_model="meta-live")
    finally:
        unregister_live_model("meta-live")


COMPILE_DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not os.environ.get("OMNITRIO_SLOW_TESTS"),
            reason="torch.compile on CPU takes minutes; set OMNITRIO_SLOW_TESTS=1 to run it",
        ),
    ),
    DEVICES[1],
]


@pytest.mark.parametrize("device", COMPILE_DEVICES)
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # torch.compile's own imports
async def test_the_compiled_decode_matches_generate(checkpoint: Path, device: str) -> None:
    """decode_fast_path: compile gives the reference's ids and codes (inductor compiles
    code for each shape it meets: slow on CPU, so that case runs on request)."""
    config = recorder_config(checkpoint, device)
    stages = tuple(
        spec.model_copy(update={"params": {**spec.params, "decode_fast_path": "compile"}})
        if spec.name in ("thinker", "talker")
        else spec
        for spec in config.stages
    )
    options = {**GREEDY, "max_tokens": 8, "talker.max_tokens": 12}
    requests = [omnitrio.Request(p, options=options) for p in ("hello there", "hi", "ok then")]
    try:
        results = await run_streams(config.model_copy(update={"stages": stages}), requests)
    finally:
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()  # inductor's process-wide compile pool
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval().to(device)
    for req, (text, frames, _) in zip(requests, results, strict=True):
        ref_text, ref_codes, _ = reference_run(model, checkpoint, req.text, 8, 12)
        assert text == ref_text
        assert frames == frames_of(ref_codes)
