"""Tiny random-init Qwen3-Omni-MoE checkpoints, built from configs defined here.

``make_tiny_checkpoint(DIR)`` writes what a real checkpoint folder holds, at toy
size (hidden 64, 2 layers, 8 code groups, ~7 MB):

    DIR/                 composite Qwen3OmniMoeForConditionalGeneration (the
                         reference ``generate(return_audio=True)`` loads this),
                         tokenizer, feature extractor, processor_config.json (the
                         thinker on vLLM loads this, its audio input the processor)
    DIR/thinker/         the thinker alone  + tokenizer + feature extractor
    DIR/talker/          the talker (with its code predictor) alone
    DIR/code2wav/        the code2wav vocoder alone

Each stage folder is written by the stage model's own ``save_pretrained`` so it
loads back with ``from_pretrained`` and a complete key set (loading a stage class
straight from the composite folder would silently random-initialise it).
``split_checkpoint`` does the same for a real, published composite checkpoint. The
sizes obey the constraints transformers 5.23 assumes but does not check; see
the comments in ``tiny_config``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerTextExperts,
)

from stages.kit import (
    NUM_BYTE_TOKENS,
    build_byte_tokenizer,
    keep_composite_files,
    write_processor_config,
)

SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
)
ROLE_WORDS = ("system", "user", "assistant")
TOKEN_IDS = {
    token: NUM_BYTE_TOKENS + index for index, token in enumerate(SPECIAL_TOKENS + ROLE_WORDS)
}
TEXT_VOCAB_SIZE = NUM_BYTE_TOKENS + len(TOKEN_IDS)

HIDDEN = 64
CODEBOOK_SIZE = 64
NUM_CODE_GROUPS = 8
# generate() suppresses the talker's top 1024 ids, so the codec vocabulary is the
# codebook followed by 1024 ids that hold the codec's special tokens.
TALKER_VOCAB_SIZE = CODEBOOK_SIZE + 1024
CODEC_IDS = {
    "codec_pad_id": TALKER_VOCAB_SIZE - 8,
    "codec_bos_id": TALKER_VOCAB_SIZE - 7,
    "codec_eos_token_id": TALKER_VOCAB_SIZE - 6,
    "codec_nothink_id": TALKER_VOCAB_SIZE - 5,
    "codec_think_bos_id": TALKER_VOCAB_SIZE - 4,
    "codec_think_eos_id": TALKER_VOCAB_SIZE - 3,
}
SPEAKERS = {"ethan": TALKER_VOCAB_SIZE - 2, "chelsie": TALKER_VOCAB_SIZE - 1}
NUM_MEL_BINS = 128
SAMPLE_RATE_HZ = 24_000
AUDIO_INPUT_SAMPLE_RATE_HZ = 16_000


def _mrope(head_dim: int) -> dict[str, object]:
    # mrope sections (temporal, height, width) must sum to head_dim / 2.
    half = head_dim // 2
    return {
        "rope_type": "default",
        "rope_theta": 1_000_000.0,
        "mrope_section": [half - 2 * (half // 4), half // 4, half // 4],
        "mrope_interleaved": True,
    }


def _moe_text(vocab_size: int, *, head_dim: int, shared_expert: int) -> dict[str, object]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        # Read by the talker (declared nowhere); vLLM builds a shared expert from it in
        # the thinker too, so the thinker's is 0, as in the published config.
        "shared_expert_intermediate_size": shared_expert,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 4096,
        "rope_parameters": _mrope(head_dim),
        "tie_word_embeddings": False,  # read by vLLM, not written by transformers 5.23
    }


def tiny_config() -> Qwen3OmniMoeConfig:
    """The tiny composite config; every id agrees with ``build_tokenizer()``."""
    ids = TOKEN_IDS
    thinker = {
        # vLLM's CPU attention needs a head size of 32 or more (the thinker runs on it).
        "text_config": _moe_text(TEXT_VOCAB_SIZE, head_dim=32, shared_expert=0),
        "audio_config": {
            "num_mel_bins": NUM_MEL_BINS,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": HIDDEN,
            "downsample_hidden_size": 16,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": HIDDEN,
            "deepstack_visual_indexes": [0],
            # read by vLLM's vision tower, not written by transformers 5.23
            "image_size": 64,
            "apply_vit_abs_pos_embed": True,
        },
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "audio_end_token_id": ids["<|audio_end|>"],  # read, never declared
        "vision_start_token_id": ids["<|vision_start|>"],  # read, never declared
        "vision_end_token_id": ids["<|vision_end|>"],
        "user_token_id": ids["user"],
    }
    talker = {
        "text_config": _moe_text(TALKER_VOCAB_SIZE, head_dim=16, shared_expert=32),
        "code_predictor_config": {
            "vocab_size": CODEBOOK_SIZE,  # == code2wav codebook_size
            "hidden_size": HIDDEN,  # == talker hidden: it reads the talker's last hidden state
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_code_groups": NUM_CODE_GROUPS,
        },
        "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": HIDDEN,
        "accept_hidden_layer": 1,  # <= thinker layers
        "speaker_id": SPEAKERS,
        "spatial_merge_size": 2,  # read, never declared
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        **CODEC_IDS,
    }
    code2wav = {
        "codebook_size": CODEBOOK_SIZE,
        "num_quantizers": NUM_CODE_GROUPS,  # == talker num_code_groups
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "decoder_dim": 32,
    }
    return composite_config(thinker, talker, code2wav, ids)


def composite_config(
    thinker: dict[str, object],
    talker: dict[str, object],
    code2wav: dict[str, object],
    ids: dict[str, int],
) -> Qwen3OmniMoeConfig:
    """The composite config of three stage configs, with the token ids ``generate`` reads."""
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_bos|>"],
        tts_eos_token_id=ids["<|tts_eos|>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


# The tokenizer's media tokens by name, as the published tokenizer_config.json has them:
# what Qwen3OmniMoeProcessor (vLLM's audio input) reads.
MEDIA_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}


def build_tokenizer():  # type: ignore[no-untyped-def]
    tokenizer = build_byte_tokenizer(SPECIAL_TOKENS, ROLE_WORDS)
    tokenizer.init_kwargs.update(MEDIA_TOKENS)  # saved as top-level keys
    return tokenizer


def build_feature_extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(
        feature_size=NUM_MEL_BINS,
        sampling_rate=AUDIO_INPUT_SAMPLE_RATE_HZ,
        return_attention_mask=True,
    )


def make_tiny_checkpoint(directory: Path, *, seed: int = 0) -> None:
    """Write a tiny random-init checkpoint to ``directory`` (see the module docstring)."""
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_config()).eval()
    _initialise_talker_experts(model)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    features = build_feature_extractor()
    features.save_pretrained(directory)
    write_processor_config(  # the published processor's vision defaults
        directory,
        "Qwen3OmniMoeProcessor",
        features,
        patch_size=16,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        max_pixels=(12845056, 12845056),
    )
    split_checkpoint(directory, directory, model=model)


def _initialise_talker_experts(model: Qwen3OmniMoeForConditionalGeneration) -> None:
    """transformers 5.23 leaves the talker's MoE expert weights as ``torch.empty``
    (whatever was in memory: tiny denormals in one process, NaN in another), so a
    random-init checkpoint would differ run to run. Initialise them like the rest."""
    std = model.config.talker_config.initializer_range
    with torch.no_grad():
        for module in model.talker.modules():
            if isinstance(module, Qwen3OmniMoeTalkerTextExperts):
                module.gate_up_proj.normal_(0.0, std)
                module.down_proj.normal_(0.0, std)


def split_checkpoint(
    source: Path, destination: Path, *, model: Qwen3OmniMoeForConditionalGeneration | None = None
) -> None:
    """Write a composite checkpoint's stages to ``destination``/{thinker,talker,code2wav}.

    The composite class loads (and fuses) the published weights correctly; each
    stage model then saves itself, so each stage folder loads on its own with a
    complete key set. The tokenizer and feature extractor go with the thinker. The
    composite's own files stay at ``destination``'s top (weights hard-linked where
    possible): the thinker on vLLM loads the composite there.
    """
    if model is None:
        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(source).eval()
    for name in ("thinker", "talker", "code2wav"):
        getattr(model, name).save_pretrained(destination / name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.save_pretrained(destination / "thinker")
    WhisperFeatureExtractor.from_pretrained(source).save_pretrained(destination / "thinker")
    keep_composite_files(source, destination)  # the vLLM thinker loads the composite
