"""Decode fast paths: what runs the forward of a batched decode step.

``decode_fast_path`` (a thinker and talker parameter; prefill always runs eager):

- ``off`` (default): the model's own forward, eager — what the parity tests pin.
- ``compile``: ``torch.compile(forward, dynamic=True)``. Batch size and cache
  length change every step, hence dynamic shapes. Runs on CPU (inductor's C++
  code generation needs a compiler and takes minutes on the tiny model) and CUDA.
- ``cuda-graphs``: ``torch.compile(forward, mode="reduce-overhead")``: the
  decode step is captured as CUDA graphs and replayed (one graph per batch-size
  and cache-length bucket torch sees). CUDA only; refused on another device.

The wrapped callable takes the same keyword arguments as the model, so the KV
batcher (``stages/_torch_kv.py``) is the same code path either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

FAST_PATHS = ("off", "compile", "cuda-graphs")


class FastPathError(ValueError):
    """``decode_fast_path`` names no fast path, or one the stage's device cannot run."""


def fast_decode_forward(stage: str, model: Any, fast_path: str) -> Callable[..., Any]:
    """The forward a batched decode step calls: ``model`` itself or a compiled wrapper."""
    if fast_path not in FAST_PATHS:
        raise FastPathError(
            f"stage {stage!r}: decode_fast_path {fast_path!r} is not one of {', '.join(FAST_PATHS)}"
        )
    if fast_path == "off":
        return model  # type: ignore[no-any-return]
    if fast_path == "cuda-graphs":
        if model.device.type != "cuda":
            raise FastPathError(
                f"stage {stage!r}: decode_fast_path 'cuda-graphs' needs device: cuda "
                f"(the stage is on {model.device}); use 'compile' or 'off'"
            )
        return torch.compile(model, mode="reduce-overhead", dynamic=False)  # type: ignore[no-any-return]
    return torch.compile(model, dynamic=True)  # type: ignore[no-any-return]
