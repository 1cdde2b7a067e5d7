"""The decode batch sizes an autoregressive stage reports beside the kit's step timing."""

from __future__ import annotations


class DecodeBatches:
    """Streams in each step's batched decode forward (the runtime's batch may hold more:
    streams that prefill or wait); used on the stage's thread only."""

    def __init__(self) -> None:
        self.last = 0
        self.max = 0

    def record(self, num_streams: int) -> None:
        self.last = num_streams
        self.max = max(self.max, num_streams)

    def snapshot(self) -> dict[str, float]:
        return {"last_decode_batch_size": self.last, "max_decode_batch_size": self.max}
