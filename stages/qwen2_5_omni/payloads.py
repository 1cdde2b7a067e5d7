"""What travels on the two edges of the Qwen2.5-Omni pipeline (never to a client).

thinker -> talker, per stream, in order::

    ReplyStart   once, after the prompt's prefill
    ReplyToken   one per generated text token the thinker fed back into itself
    ReplyEnd     once, when the thinker sampled its last token

The talker reads each token as ``embedding + last hidden state`` (what
transformers' ``generate`` sums into ``thinker_reply_part``), so the thinker sends
that sum, already sliced to one row: [D] per token, [L, D] for the prompt.

talker -> token2wav: ``CodecCodes``, the codes one talker step sampled (end codes
excluded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ReplyStart:
    prompt: torch.Tensor  # [L, D] prompt embeddings (audio rows zeroed) + last hidden states
    text_bos: torch.Tensor  # [D] thinker embedding of the speaker's text bos token
    text_eos: torch.Tensor  # [D] thinker embedding of the talker's text eos token
    text_pad: torch.Tensor  # [D] thinker embedding of the talker's text pad token


@dataclass(frozen=True, slots=True)
class ReplyToken:
    reply: torch.Tensor  # [D] token embedding + last hidden state


@dataclass(frozen=True, slots=True)
class ReplyEnd:
    num_tokens: int  # text tokens the thinker generated, the unsent last one included


@dataclass(frozen=True, slots=True)
class CodecCodes:
    codes: tuple[int, ...]
