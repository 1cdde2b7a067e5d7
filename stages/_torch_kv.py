"""Per-stream KV caches and one batched decode forward over them.

Each stream owns a ``DynamicCache`` (released with the stream). A decode step of
B streams gathers their caches into one left-padded batch cache, runs one
forward, and appends each row's new key/value back to its own cache:

    keys per layer:  stream b [1, H, T_b, Dh]  ->  batch [B, H, T_max, Dh] (zeros left)
    attention_mask:  [B, T_max + 1], 0 on each row's padding

A batch of one uses the stream's own cache directly, which is exactly what
transformers' ``generate`` does for one sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from stages._torch_slots import SlotKV

Forward = Callable[..., Any]


def cache_length(cache: DynamicCache | SlotKV) -> int:
    return int(cache.get_seq_length())


def cache_nbytes(cache: DynamicCache | SlotKV) -> int:
    if isinstance(cache, SlotKV):
        return cache.nbytes()
    total = 0
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor):
            total += keys.numel() * keys.element_size() + values.numel() * values.element_size()
    return total


def batched_decode(
    forward: Forward, caches: Sequence[DynamicCache], position_ids: torch.Tensor, **inputs: Any
) -> Any:
    """One forward of one new token per stream. position_ids: [P, B, 1] (P = 3 or 4).

    ``inputs`` hold ``input_ids`` [B, 1] or ``inputs_embeds`` [B, 1, D]; the model's
    output is returned as is, and every cache has grown by one position.
    """
    device = position_ids.device  # the stage's device: masks are made there too
    if len(caches) == 1:
        mask = torch.ones(1, cache_length(caches[0]) + 1, dtype=torch.long, device=device)
        return forward(
            **inputs,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=caches[0],
            use_cache=True,
        )
    lengths = [cache_length(c) for c in caches]
    longest = max(lengths)
    batch_cache = DynamicCache()
    for layer_index in range(len(caches[0].layers)):
        keys = _left_padded([c.layers[layer_index].keys for c in caches], longest)
        values = _left_padded([c.layers[layer_index].values for c in caches], longest)
        batch_cache.update(keys, values, layer_index)
    mask = torch.zeros(len(caches), longest + 1, dtype=torch.long, device=device)
    for row, length in enumerate(lengths):
        mask[row, longest - length :] = 1
    output = forward(
        **inputs,
        attention_mask=mask,
        position_ids=position_ids,
        past_key_values=batch_cache,
        use_cache=True,
    )
    for layer_index, layer in enumerate(batch_cache.layers):
        for row, cache in enumerate(caches):
            new_keys = layer.keys[row : row + 1, :, -1:]  # [1, H, 1, Dh]
            new_values = layer.values[row : row + 1, :, -1:]
            cache.update(new_keys.clone(), new_values.clone(), layer_index)
    return output


def _left_padded(tensors: Sequence[torch.Tensor], length: int) -> torch.Tensor:
    """[1, H, T_b, Dh] each -> [B, H, length, Dh], zeros before each row's positions."""
    first = tensors[0]
    out = first.new_zeros(len(tensors), first.shape[1], length, first.shape[3])
    for row, tensor in enumerate(tensors):
        out[row, :, length - tensor.shape[2] :] = tensor[0]
    return out
