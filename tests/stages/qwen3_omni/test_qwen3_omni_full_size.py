"""The full-size Qwen3-Omni-30B-A3B architecture (stages/qwen3_omni/full_size.py).

On the ``meta`` device (shapes only): the parameter count equals the published
checkpoint's, and the sizes obey what the stages and ``generate`` assume. The
tokenizer puts the special tokens at the published ids. On a CUDA GPU the
random-init model is built there and served by the pipeline (skips without one).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import omnitrio  # noqa: E402
from stages.qwen3_omni.full_size import (  # noqa: E402
    PUBLISHED_PARAMETERS,
    PUBLISHED_THINKER_PARAMETERS,
    TOKEN_IDS,
    build_tokenizer,
    meta_model,
    published_config,
)


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_meta_model_has_the_published_parameter_count() -> None:
    model = meta_model()
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert count(model) == PUBLISHED_PARAMETERS == 35_259_818_545
    assert count(model.thinker) == PUBLISHED_THINKER_PARAMETERS == 31_719_205_488
    # The rest is the speech side: talker (with its code predictor) and code2wav.
    assert count(model.talker) + count(model.code2wav) == 3_540_613_057


def test_the_sizes_agree_with_what_the_stages_assume() -> None:
    config = published_config()
    thinker, talker = config.thinker_config, config.talker_config
    assert thinker.text_config.num_hidden_layers == 48
    assert thinker.text_config.num_experts == 128
    assert talker.thinker_hidden_size == thinker.text_config.hidden_size
    assert talker.accept_hidden_layer <= thinker.text_config.num_hidden_layers
    assert talker.code_predictor_config.vocab_size == config.code2wav_config.codebook_size
    assert talker.num_code_groups == config.code2wav_config.num_quantizers
    # generate() suppresses the talker's top 1024 ids: the codebook sits below them.
    assert talker.text_config.vocab_size >= 1024 + config.code2wav_config.codebook_size
    # One codec frame is 80 ms of 24 kHz audio.
    assert meta_model().code2wav.total_upsample == 1920


def test_the_tokenizer_has_the_published_special_ids() -> None:
    tokenizer = build_tokenizer()
    for token, index in TOKEN_IDS.items():
        assert tokenizer.convert_tokens_to_ids(token) == index, token
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text)["input_ids"]
    assert ids[:2] == [TOKEN_IDS["<|im_start|>"], TOKEN_IDS["user"]]
    assert ids[-3:] == [TOKEN_IDS["<|im_start|>"], TOKEN_IDS["assistant"], ord("\n")]
    # Any id a random model samples decodes to text.
    assert tokenizer.decode([151000, 70000], skip_special_tokens=True) == " w151000 w70000"


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)
async def test_the_full_size_model_is_served_on_one_gpu() -> None:
    from benchmarks.qwen3_omni_gpu import full_size_pipeline

    async with full_size_pipeline("cuda") as (pipeline, _):
        options = {"temperature": 0, "talker.temperature": 0, "max_tokens": 8}
        request = omnitrio.Request("hello", options={**options, "talker.max_tokens": 16})
        async with pipeline.open_stream(request) as stream:
            items = [item async for item in stream]
    assert any(isinstance(item, omnitrio.TextDelta) for item in items)
    assert any(isinstance(item, omnitrio.AudioChunk) for item in items)
