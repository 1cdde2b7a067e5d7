"""Per-stream KV caches, stacked into one left-padded batch for a decode step.

Each stream owns its cache (one ``(keys, values)`` pair per layer, each
``[1, heads, length, head_dim]``), so a stream that ends or is cancelled frees its
memory by dropping one object. A decode step stacks the caches of the streams in
the batch, left-padded to the longest, runs one forward, and appends each row's
new entry back to its stream's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

LayerKV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StreamKV:
    """One stream's cache; ``length`` is the number of positions it holds."""

    layers: list[LayerKV] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.layers else int(self.layers[0][0].shape[-2])

    @property
    def num_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    @classmethod
    def from_cache(cls, cache: DynamicCache) -> StreamKV:
        return cls([(keys, values) for keys, values, _ in cache])


def stack(streams: list[StreamKV]) -> tuple[DynamicCache, torch.Tensor]:
    """A batched cache of ``streams`` and the attention mask for one more position.

    Returns ``(cache, attention_mask)``; the mask is ``[batch, longest + 1]`` with
    zeros over each row's left padding.
    """
    longest = max(stream.length for stream in streams)
    num_layers = len(streams[0].layers)
    data = []
    for layer in range(num_layers):
        keys = [_left_pad(stream.layers[layer][0], longest) for stream in streams]
        values = [_left_pad(stream.layers[layer][1], longest) for stream in streams]
        data.append((torch.cat(keys), torch.cat(values)))  # each [B, H, longest, D]
    device = streams[0].layers[0][0].device
    mask = torch.zeros((len(streams), longest + 1), dtype=torch.long, device=device)
    for row, stream in enumerate(streams):
        mask[row, longest - stream.length :] = 1
    return DynamicCache(ddp_cache_data=data), mask


def append_last(streams: list[StreamKV], cache: DynamicCache) -> None:
    """Append each row's newest position of ``cache`` to its stream's cache."""
    for layer, (keys, values, _) in enumerate(cache):
        for row, stream in enumerate(streams):
            old_keys, old_values = stream.layers[layer]
            stream.layers[layer] = (
                torch.cat((old_keys, keys[row : row + 1, :, -1:]), dim=-2),
                torch.cat((old_values, values[row : row + 1, :, -1:]), dim=-2),
            )


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - tensor.shape[-2]
    if missing == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, missing, 0))
