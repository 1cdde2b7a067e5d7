"""A tiny random-init Qwen2.5-Omni, built from configs defined here (no hub download).

``make_tiny_checkpoint(directory)`` writes::

    directory/                 the composite model (what transformers' generate() loads)
      config.json, model.safetensors, spk_dict.pt, tokenizer files, preprocessor_config.json
      thinker/                 Qwen2_5OmniThinkerForConditionalGeneration, tokenizer, features
      talker/                  Qwen2_5OmniTalkerForConditionalGeneration
      token2wav/               Qwen2_5OmniToken2WavModel (DiT + BigVGAN)
      spk_dict.pt              speaker name -> {cond, ref_mel, bos_token}, also in each stage folder

``split_checkpoint(source, destination)`` (``omnitrio split-checkpoint --family
qwen2.5-omni``) writes the same layout from a published composite checkpoint.

Each stage folder loads on its own with ``from_pretrained``; loading a stage class
from the composite folder would silently give random weights (see ``_loading.py``).
Sizes: hidden 64, 2 layers everywhere; the talker has 64 codec codes plus its four
special codes at the top of its vocabulary (pad, start, end, mask, as in the real model).
"""

from __future__ import annotations

import pathlib

import torch
from transformers import (
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    WhisperFeatureExtractor,
)

from stages.kit import (
    build_byte_tokenizer,
    copy_file,
    keep_composite_files,
    write_processor_config,
)

HIDDEN_SIZE = 64
NUM_CODEC_CODES = 64
NUM_MEL_BINS_IN = 16  # Whisper-style input features
MEL_DIM_OUT = 16  # DiT mel / BigVGAN input
THINKER_HEAD_DIM = 32
SPEAKERS = ("Chelsie", "Ethan")

SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|tts_text_bos|>",
    "<|tts_text_eos|>",
    "<|tts_text_pad|>",
    *(f"<|tts_bos_{name.lower()}|>" for name in SPEAKERS),
)
WORDS = ("system", "user", "assistant")
SAMPLE_RATE_IN_HZ = 16000


def make_tiny_checkpoint(directory: pathlib.Path, *, seed: int = 0) -> None:
    """Build a tiny random-init Qwen2.5-Omni; save it whole and per stage under ``directory``."""
    directory = pathlib.Path(directory)
    tokenizer = build_byte_tokenizer(SPECIAL_TOKENS, WORDS)
    ids = {
        token: int(tokenizer.convert_tokens_to_ids(token)) for token in (*SPECIAL_TOKENS, *WORDS)
    }
    config = _config(ids, vocab_size=len(tokenizer))
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    _audible_token2wav(model, seed)
    speakers = _speakers(ids, seed)
    features = WhisperFeatureExtractor(
        feature_size=NUM_MEL_BINS_IN, sampling_rate=SAMPLE_RATE_IN_HZ, return_attention_mask=True
    )
    _generation_defaults(model, ids)
    folders = {
        directory: model,
        directory / "thinker": model.thinker,
        directory / "talker": model.talker,
        directory / "token2wav": model.token2wav,
    }
    for folder, part in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        part.save_pretrained(folder)
        torch.save(speakers, folder / "spk_dict.pt")
    # The media tokens by name: what Qwen2_5OmniProcessor (vLLM's audio input) reads.
    tokenizer.init_kwargs.update(MEDIA_TOKENS)
    for folder in (directory, directory / "thinker"):
        tokenizer.save_pretrained(folder)
        features.save_pretrained(folder)
    write_processor_config(  # the published processor's vision defaults
        directory,
        "Qwen2_5OmniProcessor",
        features,
        patch_size=14,
        image_mean=(0.48145466, 0.4578275, 0.40821073),
        image_std=(0.26862954, 0.26130258, 0.27577711),
        max_pixels=(1003520, 602112),
    )


def split_checkpoint(source: pathlib.Path, destination: pathlib.Path) -> None:
    """Write a published composite checkpoint's stages to ``destination``/{thinker,talker,
    token2wav}, each with the speakers, and keep the composite at ``destination``'s top.

    The composite class loads the published weights; each stage model then saves
    itself, so each stage folder loads on its own with a complete key set. The top's
    own files stay as published (copied; its weights hard-linked where the file system
    allows, so the split does not hold them twice): the vLLM thinker loads the
    composite there, and its audio input builds the checkpoint's whole processor
    there (``processor_config.json`` or ``preprocessor_config.json``, the tokenizer
    with its media tokens by name). The tokenizer and processor files also go, as
    files, to ``thinker/``.
    """
    source, destination = pathlib.Path(source), pathlib.Path(destination)
    if not (source / "spk_dict.pt").is_file():
        raise FileNotFoundError(f"no spk_dict.pt in {source}: not a Qwen2.5-Omni checkpoint")
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(source).eval()
    top = keep_composite_files(source, destination)
    for name in ("thinker", "talker", "token2wav"):
        folder = destination / name
        getattr(model, name).save_pretrained(folder)
        copy_file(source / "spk_dict.pt", folder / "spk_dict.pt")
    for file in top:
        if not _is_model_file(file.name):
            copy_file(file, destination / "thinker" / file.name)


def _is_model_file(name: str) -> bool:
    """The composite's weights and configs: not the tokenizer's or processor's."""
    return name.startswith("model") or name in ("config.json", "generation_config.json")


# The tokenizer's media tokens by name, as the published tokenizer_config.json has them.
MEDIA_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}


def _config(ids: dict[str, int], *, vocab_size: int) -> Qwen2_5OmniConfig:
    head_dim = 16  # mrope sections sum to head_dim / 2
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    text = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        # Head size 32 (hidden / heads): vLLM's CPU attention needs 32 or more, and the
        # thinker runs on it with engine: vllm.
        "num_attention_heads": HIDDEN_SIZE // THINKER_HEAD_DIM,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rope_parameters": {**rope, "mrope_section": [4, 6, 6]},
        "tie_word_embeddings": False,  # read by vLLM, not written by transformers 5.23
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    media = {
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
        "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
    }
    thinker = {
        **media,
        "user_token_id": ids["user"],
        "text_config": text,
        "audio_config": {
            "num_mel_bins": NUM_MEL_BINS_IN,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": HIDDEN_SIZE,
            "n_window": 50,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": HIDDEN_SIZE,
            "fullatt_block_indexes": [0],
        },
    }
    codec_pad = NUM_CODEC_CODES
    talker = {
        **media,
        "vocab_size": NUM_CODEC_CODES + 4,
        "tts_codec_pad_token_id": codec_pad,
        "tts_codec_start_token_id": codec_pad + 1,
        "tts_codec_end_token_id": codec_pad + 2,
        "tts_codec_mask_token_id": codec_pad + 3,
        "tts_text_start_token_id": ids["<|tts_text_bos|>"],
        "tts_text_end_token_id": ids["<|tts_text_eos|>"],
        "tts_text_pad_token_id": ids["<|tts_text_pad|>"],
        "embedding_size": HIDDEN_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rope_parameters": rope,
    }
    token2wav = {
        "dit_config": {
            "hidden_size": HIDDEN_SIZE,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "head_dim": head_dim,
            "ff_mult": 2,
            "emb_dim": 32,
            "block_size": 24,
            "look_ahead_layers": [1],
            "look_backward_layers": [0],
            "repeats": 2,
            "num_embeds": NUM_CODEC_CODES + 4,
            "mel_dim": MEL_DIM_OUT,
            "enc_emb_dim": 16,
            "enc_dim": 16,
            "enc_channels": [32, 32, 32, 32, 96],
            "enc_attention_channels": 16,
            "enc_se_channels": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "bigvgan_config": {
            "mel_dim": MEL_DIM_OUT,
            "upsample_initial_channel": 64,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
        },
    }
    return Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=token2wav
    )


def _audible_token2wav(model: Qwen2_5OmniForConditionalGeneration, seed: int) -> None:
    """Re-draw the DiT and BigVGAN matrices with fan-in scaling.

    With the default init (std 0.02) a random token2wav is near silent (peak ~1e-8),
    which turns every PCM16 sample into 0 and makes waveform comparisons vacuous.
    """
    generator = torch.Generator().manual_seed(seed + 2)
    token2wav = model.token2wav
    with torch.no_grad():
        for part in (token2wav.code2wav_dit_model, token2wav.code2wav_bigvgan_model):
            for parameter in part.parameters():
                if parameter.ndim >= 2:
                    fan_in = parameter[0].numel()
                    drawn = torch.randn(parameter.shape, generator=generator) / fan_in**0.5
                    parameter.copy_(drawn)
        token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(0.02)


def _speakers(ids: dict[str, int], seed: int) -> dict[str, dict[str, object]]:
    generator = torch.Generator().manual_seed(seed + 1)
    return {
        name: {
            "cond": torch.randn(1, 16, generator=generator),  # [1, enc_emb_dim]
            "ref_mel": torch.randn(1, 48, MEL_DIM_OUT, generator=generator),  # [1, T, mel]
            "bos_token": ids[f"<|tts_bos_{name.lower()}|>"],
        }
        for name in SPEAKERS
    }


def _generation_defaults(model: Qwen2_5OmniForConditionalGeneration, ids: dict[str, int]) -> None:
    """Greedy by default, stop at <|im_end|>: what the parity tests and the stages assume."""
    config = model.thinker.generation_config
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    config.do_sample = False
