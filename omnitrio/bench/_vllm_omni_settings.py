"""The vllm-omni model's variants (kept apart from the model: it needs pyzmq, an extra)."""

from __future__ import annotations

from dataclasses import dataclass

SAVE_LIMIT = 512  # PR 3690's Semaphore(512) on in-flight connector saves
PACKAGING_MS = 6.38 - 0.99  # seed 002: talker sample_tokens minus _sample, p50 (ms)


@dataclass(frozen=True)
class ModelSettings:
    """What varies between the model's variants."""

    save_limit: int | None = None  # None: the unbounded save deque (before PR 3690)
    packaging_ms: float = PACKAGING_MS  # per step of the second stage (the talker), GIL held
