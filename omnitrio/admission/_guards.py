"""Two guards beside the stages' step-time models, for what those models cannot see.

- **Warm-up.** Before any stage's model has an opinion (``StepModel.ready``: its first
  steps and the pipeline's first audio), nothing is known of what a stream costs. A
  first wave that arrives at once is admitted up to ``pipeline.warmup_streams``, by
  default one batch of the first stage (its ``max_batch_size``: what an engine takes
  in one batched prefill), within ``max_streams``; the rest are refused until a model
  is ready. Before, such a wave was admitted blind up to ``max_streams``. Where a
  first stage cannot keep one whole batch in real time, a smaller ``warmup_streams``
  keeps the first wave within the limit, at the cost of the first wave's admission
  wait: nothing tells the two apart before the first audio.
- **Lateness.** Each stage's model is its own; none sees what the stages do to one
  another (windows of several stages falling due at once, host time that holds the
  GIL on shared cores). What they miss shows at the client: a stream's *lag* at an
  audio chunk is how long a player that started at its first chunk has waited for
  it (``StreamState.lag_s``, the same anchor as the playback deadline). While some
  live stream's lag is over ``LATE_SHARE`` of the client buffer, no stream is admitted:
  the pipeline is already not keeping the streams it has.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._headroom import StepModel

LATE_SHARE = 0.5
"""A live stream this share of ``client_buffer_s`` behind its playback stops admission."""


def warmup_window(
    models: Sequence[tuple[str, StepModel]],
    max_streams: int,
    audio_s: float,
    warmup_streams: int | None = None,
) -> int | None:
    """The most live streams admitted while no stage's model is ready (None: some is,
    or there are no stages): ``warmup_streams``, by default one batch of the first
    stage; within ``max_streams`` either way."""
    if not models or any(model.ready(audio_s) for _, model in models):
        return None
    window = models[0][1].max_batch_size if warmup_streams is None else warmup_streams
    return max(1, min(max_streams, window))


def late_over_s(client_buffer_s: float) -> float:
    """A live stream's lag (s) above which no stream is admitted."""
    return LATE_SHARE * client_buffer_s
