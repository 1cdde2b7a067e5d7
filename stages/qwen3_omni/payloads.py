"""What travels on the Qwen3-Omni edges (private to each pair of stages).

thinker -> talker: one ``TalkerPrompt`` with the stream's first token, then one
``TextToken`` per further token as soon as it is sampled. Only the vectors the
talker reads are sent: token embeddings, plus accept-layer hidden states for the
prompt's audio positions; the thinker's other hidden states never leave it
(seed 003).

talker -> code2wav: one ``CodecFrame`` per 80 ms frame, all code groups.

Every tensor stays on the producing stage's device: when both stages of an edge
share the device (all three on one GPU), nothing is copied to the host on the way
(``stages/_torch_device.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TalkerPrompt:
    """What the talker's prefill needs, in thinker space (the talker projects it)."""

    user_vectors: torch.Tensor  # [U, H_thinker]: embeddings, accept-layer hidden where multimodal
    user_multimodal: torch.Tensor  # [U] bool
    user_ids: torch.Tensor  # [U] long
    audio_feature_lengths: torch.Tensor | None  # [num_audios] long, for the talker's mrope
    assistant_vectors: torch.Tensor  # [3 or 4, H]: "<|im_start|>assistant\n" (+ first token)
    special_vectors: torch.Tensor  # [3, H]: tts_bos, tts_eos, tts_pad embeddings
    first_is_last: bool  # the answer is a single (final) token


@dataclass(frozen=True)
class TextToken:
    """The embedding of answer token ``index`` (>= 1); ``last`` marks the final token,
    which the talker reads as the end of text, as the reference does."""

    index: int
    vector: torch.Tensor  # [H_thinker]
    last: bool


@dataclass(frozen=True)
class CodecFrame:
    codes: torch.Tensor  # [num_code_groups] long
