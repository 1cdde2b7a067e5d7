"""The vllm-omni model's variants (kept apart from the model: it needs pyzmq, an extra)."""

from __future__ import annotations

from dataclasses import dataclass

SAVE_LIMIT = 512  # PR 3690's Semaphore(512) on in-flight connector saves
PACKAGING_MS = 6.38 - 0.99  # seed 002: talker sample_tokens minus _sample, p50 (ms)


@dataclass(frozen=True)
class ModelSettings:
    """What varies between the model's variants; the defaults are the seeds' vllm-omni."""

    save_limit: int | None = None  # None: the unbounded save deque (before PR 3690)
    packaging_ms: float = PACKAGING_MS  # per step of the second stage (the talker), GIL held
    hidden_states_to_orchestrator: bool = True  # False: PR 4527, connector only
    async_output: bool = False  # True: PR 4476, packaging off the engine loop's path
    event_driven: bool = False  # True: PR 5221, readers and wake-ups instead of 1 ms polls
    # The stage scheduler's per-schedule() scan of every bound request for chunks
    # (process_pending_chunks / restore_queues); in every variant: no PR removed it.
    chunk_scan: bool = True
    # One chunk per registration: the receive thread loads a request's next chunk only
    # after its scheduler marked it WAITING_FOR_CHUNK again (load_async); in every variant.
    chunk_per_schedule: bool = True


def variant(name: str, packaging_ms: float = PACKAGING_MS) -> ModelSettings:
    """The settings of baseline ``name``: ``vllm-omni-model`` (the seeds'),
    ``vllm-omni-model-sem512`` (with PR 3690) or ``vllm-omni-model-today`` (PRs 4527,
    4476 and 5221 merged since the seeds)."""
    if name == "vllm-omni-model":
        return ModelSettings(packaging_ms=packaging_ms)
    if name == "vllm-omni-model-sem512":
        return ModelSettings(save_limit=SAVE_LIMIT, packaging_ms=packaging_ms)
    if name == "vllm-omni-model-today":
        return ModelSettings(
            packaging_ms=packaging_ms,
            hidden_states_to_orchestrator=False,
            async_output=True,
            event_driven=True,
        )
    raise ValueError(f"no vllm-omni model variant {name!r}")
