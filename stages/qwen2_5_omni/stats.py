"""The decode batch sizes an autoregressive stage reports beside the kit's step timing."""

from __future__ import annotations


class DecodeBatches:
    """Streams in each step's batched decode forward (the runtime's batch may hold more:
    streams that prefill or wait); used on the stage's thread only."""

    def __init__(self) -> None:
        self.last = 0
        self.largest = 0

    def record(self, num_streams: int) -> None:
        self.last = num_streams
        self.largest = max(self.largest, num_streams)

    def snapshot(self) -> dict[str, float]:
        return {"last_decode_batch_size": self.last, "largest_decode_batch_size": self.largest}
