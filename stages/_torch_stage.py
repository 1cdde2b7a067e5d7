"""What the autoregressive model stages share: device, threads, packaging, statistics.

A subclass keeps its per-stream state in ``self.streams`` (objects with a ``kv``
attribute: its ``DynamicCache`` or ``None``) and its step timing in ``self.clock``;
what a step's packaging made waits in ``self.outboxes`` until the step limits allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from stages._packaging import Outbox, Packager
from stages._torch_device import stage_device
from stages._torch_kv import cache_nbytes
from stages._torch_timing import StepClock


class AutoregressiveStage:
    def __init__(
        self, name: str, device: str, *, num_threads: int | None, packaging_queue: int
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide: set the same in every stage
        self.name = name
        self.device = stage_device(name, device)
        self.streams: dict[str, Any] = {}
        self.outboxes: dict[str, Outbox] = {}
        self.clock = StepClock()
        self.packager = Packager(f"omnitrio-{name}", max_queued_jobs=packaging_queue)

    def close_stream(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)  # its KV cache goes with it
        self.outboxes.pop(stream_id, None)
        self.packager.drop(stream_id)

    def close(self) -> None:
        self.packager.close()

    def stage_statistics(self) -> Mapping[str, float]:
        streams = list(self.streams.values())
        return {
            **self.clock.snapshot(self.packager),
            "num_active_streams": len(streams),
            "kv_bytes": sum(cache_nbytes(s.kv) for s in streams if s.kv is not None),
        }
