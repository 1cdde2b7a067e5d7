"""A tiny chat checkpoint built in code: a random-init Llama decoder with the byte
tokenizer and a ChatML template, saved as a safetensors folder that the voice LLM
stage loads by ``model_path`` on every runtime (torch, CTranslate2, vLLM).

It stands in for a real instruct model where only the machinery is tested (the
tokens, the batching, the engine): its answers are random bytes, but the same bytes
on every runtime that computes in float32 (its float32 weights are bfloat16 values,
as the stage's loader reads them, so no runtime rounds them apart). The attention
head size is 32, the smallest vLLM's CPU attention takes; no hub download.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from stages.kit import build_byte_tokenizer

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
WORDS = ("system", "user", "assistant")
INIT_STD = 0.5  # wide enough that greedy picks are far from ties (vLLM's kernels round apart)


def make_tiny_chat_checkpoint(directory: Path, *, seed: int = 0) -> Path:
    """Write the checkpoint into ``directory`` (made if missing); returns it."""
    tokenizer = build_byte_tokenizer(SPECIAL_TOKENS, WORDS)
    end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_start|>")),
        eos_token_id=end,
        pad_token_id=end,
        initializer_range=INIT_STD,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # the stage's loader reads weights in bfloat16 (llm_weights.py)
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
    model.generation_config = GenerationConfig(eos_token_id=end, pad_token_id=end)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
