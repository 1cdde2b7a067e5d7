"""PCM16 helpers for the web layer: resampling to the session's rate (omnitrio's one
resampler, soxr), WAV framing, and the limits on audio a client uploads
(``checked_input_audio``)."""

from __future__ import annotations

import io
import wave

from .._resample import resample_pcm16 as resample_pcm16
from ._settings import ServerSettings


class InputAudioError(ValueError):
    """Uploaded audio the server will not take; the message says what and the limit."""


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


def checked_input_audio(data: bytes, settings: ServerSettings) -> tuple[bytes, int]:
    """(PCM16 samples, sample rate) of an uploaded mono 16-bit WAV file, within the
    server's limits: a rate in ``min/max_input_sample_rate_hz`` and at most
    ``max_input_audio_s`` of audio. Every endpoint that takes audio files calls this
    before anything is resampled; ``InputAudioError`` names what is wrong."""
    try:
        pcm16, rate_hz = pcm16_from_wav(data)
    except ValueError as exc:
        raise InputAudioError(str(exc)) from None
    check_input_audio(len(pcm16) // 2, rate_hz, settings)
    return pcm16, rate_hz


def check_input_audio(num_samples: int, rate_hz: int, settings: ServerSettings) -> None:
    """``InputAudioError`` unless ``num_samples`` at ``rate_hz`` is within the limits."""
    low, high = settings.min_input_sample_rate_hz, settings.max_input_sample_rate_hz
    if not low <= rate_hz <= high:
        raise InputAudioError(
            f"the audio's sample rate {rate_hz} Hz is outside the supported {low}-{high} Hz"
        )
    duration_s = num_samples / rate_hz
    if duration_s > settings.max_input_audio_s:
        raise InputAudioError(
            f"{duration_s:.1f} s of audio is over the limit of {settings.max_input_audio_s:g} s"
        )
