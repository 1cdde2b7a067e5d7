"""omnitrio's one resampler: soxr (libsoxr's windowed-sinc filter, anti-aliased) for
every change of sample rate in Python — the server's PCM16 between a stage's rate and
a session's, and the voice stages' float audio. ``StreamResampler`` keeps the filter's
state between chunks of one live signal (a microphone), so chunk edges leave no clicks.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

Floats = npt.NDArray[np.float32]


def resample_float(samples: Floats, from_hz: int, to_hz: int) -> Floats:
    """A whole mono float32 signal at ``to_hz``."""
    if from_hz == to_hz or samples.size == 0:
        return samples
    return np.asarray(soxr.resample(samples, from_hz, to_hz), dtype=np.float32)


def resample_pcm16(pcm16: bytes, from_hz: int, to_hz: int) -> bytes:
    """A whole mono little-endian PCM16 signal at ``to_hz``."""
    if from_hz == to_hz or not pcm16:
        return pcm16
    samples = np.frombuffer(pcm16, dtype="<i2")
    return np.asarray(soxr.resample(samples, from_hz, to_hz), dtype="<i2").tobytes()


class StreamResampler:
    """One live mono float32 signal, chunk by chunk; ``flush`` returns the rest.

    ``quality`` is soxr's: with ``"HQ"`` (the default, anti-aliased) the output lags the
    input by the filter's delay and comes in bursts: 24 -> 16 kHz in 20 ms chunks holds
    back ~21 ms on average, up to ~37. ``"QQ"`` (cubic interpolation, no anti-alias
    filter) holds back nothing: for a detector that must hear the audio as it comes."""

    def __init__(self, from_hz: int, to_hz: int, *, quality: str = "HQ") -> None:
        self.from_hz, self.to_hz = from_hz, to_hz
        self._stream = (
            None
            if from_hz == to_hz
            else soxr.ResampleStream(from_hz, to_hz, 1, dtype="float32", quality=quality)
        )

    def push(self, samples: Floats) -> Floats:
        if self._stream is None:
            return samples
        return np.asarray(self._stream.resample_chunk(samples), dtype=np.float32)

    def flush(self) -> Floats:
        if self._stream is None:
            return np.zeros(0, np.float32)
        return np.asarray(
            self._stream.resample_chunk(np.zeros(0, np.float32), last=True), dtype=np.float32
        )
