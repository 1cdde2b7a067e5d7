"""PCM16 bytes and float32 samples, as the voice-chat stages hear and speak them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float32]


def pcm16_to_float(pcm16: bytes) -> Floats:
    """Little-endian PCM16 bytes as float32 samples in [-1, 1]."""
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm16(samples: Floats) -> bytes:
    """float32 samples (clipped to [-1, 1]) as little-endian PCM16 bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


QUIET_LEVEL = 0.001
"""-60 dBFS: below it a sample is silence to a listener (PCM16 33)."""


def without_quiet_start(samples: Floats, sample_rate_hz: int, keep_s: float = 0.005) -> Floats:
    """``samples`` from ``keep_s`` before the first one above ``QUIET_LEVEL`` (all of
    them where none is): the voice's near-silent first 25-50 ms of a phrase, which delay
    an answer's first sound and carry nothing."""
    loud = np.flatnonzero(np.abs(samples) > QUIET_LEVEL)
    if loud.size == 0:
        return samples
    return samples[max(0, int(loud[0]) - int(keep_s * sample_rate_hz)) :]
