"""When requests are sent: Poisson arrivals with a burstiness knob, as vllm's bench does.

Inter-arrival gaps are gamma-distributed with shape ``burstiness`` and mean
``1 / request_rate``: burstiness 1 is a Poisson process, below 1 is burstier,
above 1 is more regular. An infinite rate sends every request at once (the
concurrency limit then paces them).
"""

from __future__ import annotations

import math
import random


def arrival_offsets_s(
    num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Send times of ``num_requests`` requests, in seconds from the start, non-decreasing."""
    if request_rate <= 0:
        raise ValueError(f"request_rate must be positive (or inf), got {request_rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    scale = 1.0 / (request_rate * burstiness)
    offsets, now = [], 0.0
    for _ in range(num_requests):
        offsets.append(now)
        now += rng.gammavariate(burstiness, scale)
    return offsets
