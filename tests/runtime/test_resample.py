"""omnitrio's one resampler filters what the new rate cannot hold instead of folding it
back into the band (what linear interpolation did), and keeps what it can."""

from __future__ import annotations

import numpy as np

from omnitrio import StreamResampler, resample_float, resample_pcm16


def tone(freq_hz: float, rate_hz: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    return (0.5 * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def rms(samples: np.ndarray) -> float:
    middle = samples[len(samples) // 4 : -len(samples) // 4]  # away from the edges
    return float(np.sqrt(np.mean(middle.astype(np.float64) ** 2)))


def test_a_tone_above_the_new_nyquist_is_removed_and_one_below_is_kept() -> None:
    above = resample_float(tone(10_000, 24_000), 24_000, 16_000)  # 16 kHz holds up to 8 kHz
    below = resample_float(tone(3_000, 24_000), 24_000, 16_000)
    assert len(above) == len(below) == 16_000
    assert rms(above) < 0.01 * rms(tone(10_000, 24_000))  # >= 40 dB down, not aliased
    assert abs(rms(below) - rms(tone(3_000, 16_000))) < 0.01


def test_chunks_through_a_stream_resampler_equal_the_whole_signal() -> None:
    signal = tone(440, 24_000, 0.5)
    stream = StreamResampler(24_000, 16_000)
    chunks = [stream.push(signal[i : i + 480]) for i in range(0, len(signal), 480)]
    joined = np.concatenate([*chunks, stream.flush()])
    assert abs(len(joined) - 8_000) <= 1
    whole = resample_float(signal, 24_000, 16_000)
    n = min(len(joined), len(whole))
    assert np.max(np.abs(joined[1000 : n - 1000] - whole[1000 : n - 1000])) < 1e-3


def test_pcm16_keeps_its_format_and_same_rate_is_untouched() -> None:
    pcm16 = (tone(440, 22_050) * 32767).astype("<i2").tobytes()
    out = resample_pcm16(pcm16, 22_050, 24_000)
    assert len(out) == 2 * 24_000
    assert resample_pcm16(pcm16, 24_000, 24_000) is pcm16
