"""Batching per-stream KV caches into one decode forward, and splitting them back.

Each stream keeps its own cache (one (keys, values) pair per layer, each
[1, H, T_i, D]) so it can join and leave the batch at any step and be freed on
its own. For a step the caches are left-padded to the longest, stacked, and
masked; afterwards each stream takes back its rows without the padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Layer = tuple[torch.Tensor, torch.Tensor]
KvCache = list[Layer]


@dataclass(frozen=True)
class DecodeBatch:
    caches: KvCache  # per layer: keys and values [B, H, T, D]
    attention_mask: torch.Tensor  # [B, T + 1]: 0 over padding
    position_ids: torch.Tensor  # [B, 1]: each stream's own next position
    lengths: tuple[int, ...]  # each stream's cache length T_i
    padded_length: int  # T


def stack(caches: list[KvCache]) -> DecodeBatch:
    lengths = tuple(cache[0][0].shape[2] for cache in caches)
    padded = max(lengths)
    layers: KvCache = []
    for layer in range(len(caches[0])):
        keys = [_left_pad(cache[layer][0], padded) for cache in caches]
        values = [_left_pad(cache[layer][1], padded) for cache in caches]
        layers.append((torch.cat(keys), torch.cat(values)))
    mask = torch.zeros(len(caches), padded + 1, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, padded - length :] = 1
    positions = torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
    return DecodeBatch(layers, mask, positions, lengths, padded)


def split(layers: KvCache, batch: DecodeBatch) -> list[KvCache]:
    """Each stream's cache after the step: its row, padding dropped, one step longer."""
    out: list[KvCache] = []
    for row, length in enumerate(batch.lengths):
        start = batch.padded_length - length
        out.append(
            [
                (keys[row : row + 1, :, start:].clone(), values[row : row + 1, :, start:].clone())
                for keys, values in layers
            ]
        )
    return out


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - tensor.shape[2]
    if missing == 0:
        return tensor
    shape = (tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([tensor.new_zeros(shape), tensor], dim=2)
