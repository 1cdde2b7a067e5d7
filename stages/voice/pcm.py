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
