"""The voice LLM's engines (llm_engines.py): the params that do not fit are refused
naming the stage before a model loads, and int8 quantizes every linear layer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stages.voice.llm_engines import check_engine, int8_linear  # noqa: E402


def test_an_unknown_llm_dtype_is_refused_naming_the_stage_and_the_choices() -> None:
    pytest.importorskip("torch")
    from stages.voice.llm import SmolLM2Llm

    with pytest.raises(ValueError, match=r"stage 'llm': dtype must be one of .*'int8'.*'int4'"):
        SmolLM2Llm("llm", dtype="int4")


@pytest.mark.parametrize(
    ("device", "dtype", "runtime", "refusal"),
    [
        ("cpu", "bfloat16", "onnx", r"stage 'llm': runtime must be one of .*'vllm'.*not 'onnx'"),
        ("cuda", "int8", "torch", r"stage 'llm': dtype int8 runs on the CPU only, not 'cuda'"),
        ("cuda:1", "float32", "ctranslate2", r"stage 'llm': runtime ctranslate2 runs on the CPU"),
        ("cuda", "float32", "llamacpp", r"stage 'llm': runtime llamacpp runs on the CPU"),
    ],
)
def test_an_engine_that_does_not_fit_is_refused(
    device: str, dtype: str, runtime: str, refusal: str
) -> None:
    with pytest.raises(ValueError, match=refusal):
        check_engine("llm", device, device.split(":")[0], dtype, runtime)
    check_engine("llm", "cpu", "cpu", dtype, "vllm" if runtime == "onnx" else runtime)


@pytest.mark.parametrize("wrong", [-1, 20, 2.5, True])
def test_a_wrong_ctranslate2_nice_is_refused_naming_the_stage_before_a_model_loads(
    wrong: object,
) -> None:
    from stages.voice.llm import SmolLM2Llm

    refusal = r"stage 'llm': ctranslate2_nice must be an integer from 0 to 19"
    with pytest.raises(ValueError, match=refusal):
        SmolLM2Llm("llm", runtime="ctranslate2", ctranslate2_nice=wrong, model_path="/nowhere")


def test_int8_quantizes_every_linear_layer() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    quantized = int8_linear(model)
    assert not [m for m in quantized.modules() if type(m) is torch.nn.Linear]
    dynamic = [
        m
        for m in quantized.modules()
        if type(m).__name__ == "Linear" and "quantized" in type(m).__module__
    ]
    assert len(dynamic) == 2
    assert quantized(torch.ones(1, 8)).shape == (1, 4)
