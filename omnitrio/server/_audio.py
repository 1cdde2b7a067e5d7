"""PCM16 helpers for the web layer: resampling to the session's rate (omnitrio's one
resampler, soxr) and WAV framing."""

from __future__ import annotations

import io
import wave

from .._resample import resample_pcm16 as resample_pcm16


def wav_bytes(pcm16: bytes, sample_rate_hz: int) -> bytes:
    """A complete mono 16-bit WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate_hz)
        wav.writeframes(pcm16)
    return buffer.getvalue()


def wav_header(sample_rate_hz: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum)."""
    header = bytearray(wav_bytes(b"", sample_rate_hz))
    header[4:8] = (0xFFFFFFFF).to_bytes(4, "little")
    header[40:44] = (0xFFFFFFFF - 36).to_bytes(4, "little")
    return bytes(header)


def pcm16_from_wav(data: bytes) -> tuple[bytes, int]:
    """(PCM16 samples, sample rate) of a mono 16-bit WAV file; ``ValueError`` otherwise."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
                raise ValueError("the WAV must be mono 16-bit PCM")
            return wav.readframes(wav.getnframes()), wav.getframerate()
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"not a readable WAV file ({exc})") from None
