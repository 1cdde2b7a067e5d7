"""A stage's KV cache, kept batched: one slot per stream, written in place.

Per layer the stage holds keys and values ``[S, H, T, Dh]`` (S slots, T positions,
both grown by doubling, so growth costs O(1) a token amortised). A stream's prompt
is prefilled into a ``DynamicCache`` of its own and copied into a free slot once
(``adopt``); from then on a decode step writes each stream's new key/value at its
own position of its own slot and attends to a view of the slots it runs:

    keys per layer:  buffer[lo:hi, :, :L]   (a view: no copy, no gather)
    attention mask:  [hi - lo, 1, 1, L], row r true at positions <= its length

so a step moves no key or value it does not attend. Streams are kept in the lowest
slots: a released slot is filled by moving the highest stream into it (one copy of
that stream's KV, once, when a stream ends). A step over a subset of the slots runs
the rows between its lowest and highest slot; a slot in between that is not in the
step runs as a filler row whose key/value lands past that slot's length, where its
next real write overwrites it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import DynamicLayer

Forward = Callable[..., Any]
FIRST_SLOTS = 4
FIRST_POSITIONS = 256


class SlotKV:
    """One stream's KV: its slot in the stage's ``KVSlots`` and its length."""

    def __init__(self, pool: KVSlots, slot: int, length: int) -> None:
        self.pool: KVSlots | None = pool
        self.slot = slot
        self.length = length

    def release(self) -> None:
        """Give the slot back (idempotent): the stream decodes no more."""
        if self.pool is not None:
            self.pool.release(self)

    def get_seq_length(self) -> int:
        return self.length

    def nbytes(self) -> int:
        return 0 if self.pool is None else self.length * self.pool.bytes_per_position


class KVSlots:
    """The batched KV cache of one stage (see the module docstring)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []  # per layer [S, H, T, Dh]
        self.values: list[torch.Tensor] = []
        self.owners: list[SlotKV] = []  # slot i holds owners[i]
        self.bytes_per_position = 0

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def num_positions(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def adopt(self, prefilled: DynamicCache) -> SlotKV:
        """Copy a stream's prefilled cache into the next free slot; the stream's handle."""
        layers = [(layer.keys, layer.values) for layer in prefilled.layers]
        length = int(layers[0][0].shape[2])
        if not self.keys:
            self._allocate(layers)
        self._reserve(len(self.owners) + 1, length + 1)
        kv = SlotKV(self, len(self.owners), length)
        self.owners.append(kv)
        for index, (keys, values) in enumerate(layers):
            self.keys[index][kv.slot, :, :length] = keys[0]
            self.values[index][kv.slot, :, :length] = values[0]
        return kv

    def release(self, kv: SlotKV) -> None:
        last = self.owners.pop()
        if last is not kv:  # keep the streams in the lowest slots: move the last one down
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[kv.slot, :, : last.length] = keys[last.slot, :, : last.length]
                values[kv.slot, :, : last.length] = values[last.slot, :, : last.length]
            last.slot = kv.slot
            self.owners[kv.slot] = last
        kv.pool, kv.length = None, 0

    def decode(
        self, forward: Forward, kvs: Sequence[SlotKV], position_ids: torch.Tensor, **inputs: Any
    ) -> tuple[Any, list[int]]:
        """One forward of one new token per stream; returns the output and each stream's
        row in it. position_ids: [P, B, 1]; ``inputs``: tensors with the batch first
        (``input_ids`` [B, 1], ``inputs_embeds`` [B, 1, D]) or anything else, passed on."""
        slots = [kv.slot for kv in kvs]
        if any(kv.pool is not self for kv in kvs):
            raise ValueError("a released or foreign SlotKV cannot decode")
        low, high = min(slots), max(slots) + 1
        rows = [slot - low for slot in slots]
        lengths = [owner.length for owner in self.owners[low:high]]
        self._reserve(high, max(lengths) + 1)
        if high - low != len(kvs) or rows != sorted(rows):
            inputs = {k: _rows(v, rows, high - low, 0, len(kvs)) for k, v in inputs.items()}
            position_ids = _rows(position_ids, rows, high - low, 1, len(kvs))
        span = max(lengths) + 1
        mask, write = None, None
        if min(lengths) + 1 != span:  # rows of unequal length: each sees its own positions
            write = torch.tensor(lengths, device=position_ids.device)
            positions = torch.arange(span, device=position_ids.device)
            mask = (positions[None, :] <= write[:, None]).view(high - low, 1, 1, span)
        cache = _StepCache(self, low, high, write, span)
        output = forward(
            **inputs,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        for kv in kvs:
            kv.length += 1
        return output, rows

    def _allocate(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for keys, values in layers:
            shape = (FIRST_SLOTS, keys.shape[1], FIRST_POSITIONS, keys.shape[3])
            self.keys.append(keys.new_zeros(shape))
            self.values.append(values.new_zeros((*shape[:3], values.shape[3])))
            self.bytes_per_position += keys.shape[1] * (
                keys.shape[3] * keys.element_size()
            ) + values.shape[1] * (values.shape[3] * values.element_size())

    def _reserve(self, num_slots: int, num_positions: int) -> None:
        """Grow (by doubling) until ``num_slots`` x ``num_positions`` fit."""
        slots, positions = self.num_slots, self.num_positions
        if num_slots <= slots and num_positions <= positions:
            return
        while slots < num_slots:
            slots *= 2
        while positions < num_positions:
            positions *= 2
        for buffers in (self.keys, self.values):
            for index, old in enumerate(buffers):
                new = old.new_zeros((slots, old.shape[1], positions, old.shape[3]))
                new[: old.shape[0], :, : old.shape[2]] = old
                buffers[index] = new


def _rows(value: Any, rows: list[int], num_rows: int, dim: int, batch: int) -> Any:
    """``value`` with its batch dimension spread over ``num_rows`` rows (zeros in between)."""
    if not isinstance(value, torch.Tensor) or value.dim() <= dim or value.shape[dim] != batch:
        return value
    shape = list(value.shape)
    shape[dim] = num_rows
    out = value.new_zeros(shape)
    index = torch.tensor(rows, device=value.device)
    out.index_copy_(dim, index, value)
    return out


class _StepLayer(DynamicLayer):
    """One layer's view of the slots for one decode step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, step: _StepCache) -> None:
        super().__init__()
        self.buffer_keys, self.buffer_values, self.step = keys, values, step
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.step
        if step.write is None:  # every row writes the same position: a plain slice
            position = step.span - 1
            self.buffer_keys[step.low : step.high, :, position] = key_states[:, :, 0]
            self.buffer_values[step.low : step.high, :, position] = value_states[:, :, 0]
        else:
            self.buffer_keys[step.slots, :, step.write] = key_states[:, :, 0]
            self.buffer_values[step.slots, :, step.write] = value_states[:, :, 0]
        self.keys = self.buffer_keys[step.low : step.high, :, : step.span]
        self.values = self.buffer_values[step.low : step.high, :, : step.span]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.step.span - 1 + query_length, 0

    def get_seq_length(self) -> int:
        return self.step.span - 1


class _StepCache(Cache):
    def __init__(
        self, pool: KVSlots, low: int, high: int, write: torch.Tensor | None, span: int
    ) -> None:
        """``write``: each row's next position; None when every row's is ``span - 1``."""
        self.low, self.high, self.write, self.span = low, high, write, span
        self.slots = None if write is None else torch.arange(low, high, device=write.device)
        super().__init__(
            layers=[
                _StepLayer(keys, values, self)
                for keys, values in zip(pool.keys, pool.values, strict=True)
            ]
        )
