"""A byte-level tokenizer for tiny checkpoints, built in code (no hub download).

Real Qwen-Omni checkpoints ship their own tokenizer files; tiny random-init
checkpoints made by ``omnitrio make-tiny-model`` get this one instead so the text
path (chat template, special tokens, streaming detokenization) is the real one:
a ``PreTrainedTokenizerFast`` saved beside the weights and loaded back with
``AutoTokenizer.from_pretrained``.

Ids 0-255 are the 256 bytes (GPT-2 byte-to-unicode alphabet, so any text
round-trips); the named tokens follow, in the order given, from id 256. Role
words such as ``user`` and ``assistant`` are single tokens, as in Qwen's own
vocabulary, because ``generate`` finds the prompt's segments by their ids.

``write_processor_config`` writes the whole multimodal processor's config beside it,
which vLLM's audio input builds (the stages read the feature extractor alone).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

NUM_BYTE_TOKENS = 256

# Qwen's chat template, reduced to the text and audio turns the tiny models use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_byte_tokenizer(
    special_tokens: Sequence[str], words: Sequence[str] = (), vocab: dict[str, int] | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: bytes, then ``special_tokens``, then ``words``.

    ``special_tokens`` are never split and are skipped by ``decode(...,
    skip_special_tokens=True)``; ``words`` (e.g. ``user``, ``assistant``) are
    matched whole in text but decode as text. A ``vocab`` (byte-level symbols ->
    id, the 256 bytes included) fixes the ids: a special token or word already in
    it keeps its id.
    """
    if vocab is None:
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_order)
        vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    fast.add_tokens(list(words))
    fast.chat_template = CHAT_TEMPLATE
    if "<|im_end|>" in special_tokens:
        fast.eos_token = "<|im_end|>"
        fast.pad_token = "<|im_end|>"
    return fast


def write_processor_config(
    directory: Path,
    processor_class: str,
    features: Any,
    *,
    patch_size: int,
    image_mean: Sequence[float],
    image_std: Sequence[float],
    max_pixels: tuple[int, int],
) -> None:
    """``processor_config.json`` in ``directory``: ``processor_class`` (a Qwen-Omni
    processor) with ``features`` (its ``WhisperFeatureExtractor``) and its image and
    video processors, written as data: building those needs torchvision, which the
    project does not install, and the engine runs no image or video (its
    ``limit_mm_per_prompt`` allows audio only). ``max_pixels``: the image's and the
    video's ``longest_edge``."""
    vision = {
        "patch_size": patch_size,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": list(image_mean),
        "image_std": list(image_std),
    }
    config = {
        "processor_class": processor_class,
        "feature_extractor": features.to_dict(),
        "image_processor": {
            **vision,
            "image_processor_type": "Qwen2VLImageProcessor",
            "size": {"longest_edge": max_pixels[0], "shortest_edge": 3136},
        },
        "video_processor": {
            **vision,
            "video_processor_type": "Qwen2VLVideoProcessor",
            "size": {"longest_edge": max_pixels[1], "shortest_edge": 100352},
        },
    }
    (directory / "processor_config.json").write_text(json.dumps(config, indent=2) + "\n")


def byte_symbols(data: bytes) -> str:
    """``data`` in the byte-level alphabet (how a vocab spells byte sequences)."""
    return "".join(_BYTE_TO_UNICODE[byte] for byte in data)


def _byte_order(symbol: str) -> int:
    """Order the byte-level alphabet by the byte each symbol stands for."""
    return _UNICODE_TO_BYTE[symbol]


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map (what ByteLevel uses).
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(NUM_BYTE_TOKENS):
        if byte not in mapping:
            mapping[byte] = chr(NUM_BYTE_TOKENS + extra)
            extra += 1
    return mapping


_BYTE_TO_UNICODE = _bytes_to_unicode()
_UNICODE_TO_BYTE = {char: byte for byte, char in _BYTE_TO_UNICODE.items()}
