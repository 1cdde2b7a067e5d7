"""The thinker's prompt: chat template text and, for audio requests, Whisper-style features."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor

from omnitrio import AudioInput, Request

AUDIO_TOKEN = "<|AUDIO|>"


@dataclass(frozen=True, slots=True)
class Prompt:
    input_ids: torch.Tensor  # [1, L]
    input_features: torch.Tensor | None  # [1, mels, frames]
    feature_attention_mask: torch.Tensor | None  # [1, frames]


def build_prompt(
    request: Request,
    tokenizer: PreTrainedTokenizerBase,
    features: WhisperFeatureExtractor,
    system_prompt: str | None = None,
) -> Prompt:
    """The user turn (audio placeholders first, then text) followed by the assistant header."""
    content, input_features, mask = request.text, None, None
    if request.audio is not None:
        input_features, mask = audio_features(request.audio, features)
        num_audio_tokens = int(audio_token_count(mask.sum(-1)))
        content = f"<|audio_bos|>{AUDIO_TOKEN * num_audio_tokens}<|audio_eos|>{content}"
    messages = [{"role": "user", "content": content}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    input_ids = tokenizer(text, return_tensors="pt").input_ids
    return Prompt(input_ids, input_features, mask)


def audio_features(
    audio: AudioInput, features: WhisperFeatureExtractor
) -> tuple[torch.Tensor, torch.Tensor]:
    """PCM16 -> (input_features [1, mels, frames], feature_attention_mask [1, frames])."""
    if audio.sample_rate_hz != features.sampling_rate:
        raise ValueError(
            f"audio must be {features.sampling_rate} Hz mono PCM16, got {audio.sample_rate_hz} Hz; "
            "resample it before sending"
        )
    if len(audio.pcm16) % 2 or not audio.pcm16:
        raise ValueError("audio must be a non-empty whole number of 16-bit samples")
    wave = np.frombuffer(audio.pcm16, dtype="<i2").astype(np.float32) / 32768.0
    if len(wave) > features.n_samples:
        raise ValueError(f"audio longer than {features.chunk_length} s is not supported")
    out = features(
        wave,
        sampling_rate=features.sampling_rate,
        padding="max_length",
        return_attention_mask=True,
        return_tensors="pt",
    )
    return out["input_features"], out["attention_mask"]


def audio_token_count(num_feature_frames: torch.Tensor) -> torch.Tensor:
    """Audio encoder output length for a feature length (two stride-2 stages)."""
    after_conv = (num_feature_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1
