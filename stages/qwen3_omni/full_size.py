"""The full-size Qwen3-Omni-30B-A3B architecture, built in code: no download, ever.

``published_config()`` has the sizes and ids of the published
``Qwen/Qwen3-Omni-30B-A3B-Instruct`` ``config.json``: a 48-layer MoE thinker
(hidden 2048, 128 experts, 8 per token) with its audio and vision encoders, a
20-layer MoE talker (hidden 1024, 128 experts, 6 per token) with a 5-layer code
predictor for 16 code groups, and the code2wav vocoder. Built on the ``meta``
device it has the published parameter count (``PUBLISHED_PARAMETERS``: the bf16
``total_size`` of the checkpoint's safetensors index, 70,519,637,090 bytes, over
2 bytes per parameter; ``tests/stages/qwen3_omni/test_qwen3_omni_full_size.py`` checks it).

``random_model(device)`` builds it with random weights straight on a device (the
GPU benchmark: ``benchmarks/qwen3_omni_gpu.py``); ``build_tokenizer()`` is a
byte-level tokenizer whose special tokens carry the published ids, so prompts
and the chat template behave as the real ones do (the text itself is noise).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
)

from stages.kit import NUM_BYTE_TOKENS, build_byte_tokenizer, byte_symbols

from .tiny import (
    ROLE_WORDS,
    SPECIAL_TOKENS,
    build_feature_extractor,
    composite_config,
)

PUBLISHED_PARAMETERS = 35_259_818_545  # thinker + talker + code2wav (Instruct)
PUBLISHED_THINKER_PARAMETERS = 31_719_205_488  # the thinker-only Thinking checkpoint

# The published token ids (the tiny tokenizer's names for them).
TOKEN_IDS = {
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<|tts_pad|>": 151671,
    "<|tts_bos|>": 151672,
    "<|tts_eos|>": 151673,
    "<|audio_pad|>": 151675,
    "system": 8948,
    "user": 872,
    "assistant": 77091,
}
TEXT_VOCAB_SIZE = 152064
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}


def _rope(theta: float, mrope: bool) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if mrope:
        rope.update(mrope_section=[24, 20, 20], interleaved=True, mrope_interleaved=True)
    return rope


def _moe_text(**sizes: Any) -> dict[str, Any]:
    return {
        "head_dim": 128,
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "rope_parameters": _rope(1_000_000.0, mrope=True),
        **sizes,
    }


def published_config() -> Qwen3OmniMoeConfig:
    """Qwen3-Omni-30B-A3B-Instruct's architecture (sizes and ids of its config.json)."""
    ids = TOKEN_IDS
    modality_ids = {
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
    }
    thinker = {
        "text_config": _moe_text(
            vocab_size=TEXT_VOCAB_SIZE,
            hidden_size=2048,
            intermediate_size=768,
            moe_intermediate_size=768,
            shared_expert_intermediate_size=0,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            num_experts=128,
            num_experts_per_tok=8,
        ),
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 32,
            "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "d_model": 1280,
            "output_dim": 2048,
            "downsample_hidden_size": 480,
            "max_source_positions": 1500,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24],
            "hidden_act": "gelu_pytorch_tanh",
        },
        **modality_ids,
        "audio_end_token_id": ids["<|audio_end|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "user_token_id": ids["user"],
    }
    talker = {
        "text_config": _moe_text(
            vocab_size=3072,
            hidden_size=1024,
            intermediate_size=2048,
            moe_intermediate_size=384,
            shared_expert_intermediate_size=768,
            num_hidden_layers=20,
            num_attention_heads=16,
            num_key_value_heads=2,
            num_experts=128,
            num_experts_per_tok=6,
        ),
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 5,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "rope_parameters": _rope(1_000_000.0, mrope=False),
            "num_code_groups": 16,
        },
        "num_code_groups": 16,
        "thinker_hidden_size": 2048,
        "accept_hidden_layer": 24,
        "speaker_id": dict(SPEAKERS),
        "spatial_merge_size": 2,
        **modality_ids,
        **CODEC_IDS,
    }
    code2wav = {
        "codebook_size": 2048,
        "codebook_dim": 512,
        "semantic_codebook_size": 4096,
        "num_quantizers": 16,
        "num_semantic_quantizers": 1,
        "vector_quantization_hidden_dimension": 512,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rope_parameters": _rope(10_000.0, mrope=False),
        "layer_scale_initial_scale": 0.01,
        "rms_norm_eps": 1e-5,
        "decoder_dim": 1536,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
    }
    return composite_config(thinker, talker, code2wav, ids)


def meta_model() -> Qwen3OmniMoeForConditionalGeneration:
    """The full-size model on the ``meta`` device: shapes only, no memory, no init."""
    with torch.device("meta"):
        return Qwen3OmniMoeForConditionalGeneration(published_config())


def random_model(
    device: str | torch.device,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    config: Qwen3OmniMoeConfig | None = None,
) -> Qwen3OmniMoeForConditionalGeneration:
    """A model of ``config`` (default: the full size) with random weights, allocated and
    initialised on ``device``: no host copy of the weights is ever made."""
    torch.manual_seed(seed)
    config = config if config is not None else published_config()
    with torch.device(device):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=dtype)
    initialise_unset_weights(model)
    return model.eval()


def initialise_unset_weights(model: torch.nn.Module) -> None:
    """transformers 5.23 leaves fused MoE expert weights as ``torch.empty``; draw them
    (normal, the config's initializer_range) so a random model is a function of its seed."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                parameter.normal_(0.0, 0.02)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, ``TEXT_VOCAB_SIZE`` ids: bytes at 0-255, the special tokens and role
    words at their published ids, and every other id a filler word (`` w<id>``) so any
    id the random model samples decodes to something."""
    vocab = {byte_symbols(bytes([byte])): byte for byte in range(NUM_BYTE_TOKENS)}
    filler = {index: byte_symbols(f" w{index}".encode()) for index in range(TEXT_VOCAB_SIZE)}
    published = {index: token for token, index in TOKEN_IDS.items()}
    for index in range(NUM_BYTE_TOKENS, TEXT_VOCAB_SIZE):
        vocab[published.get(index, filler[index])] = index
    return build_byte_tokenizer(SPECIAL_TOKENS, ROLE_WORDS, vocab=vocab)


__all__ = [
    "PUBLISHED_PARAMETERS",
    "PUBLISHED_THINKER_PARAMETERS",
    "build_feature_extractor",
    "build_tokenizer",
    "meta_model",
    "published_config",
    "random_model",
]
