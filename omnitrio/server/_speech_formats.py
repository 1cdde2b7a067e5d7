"""Speech in the formats OpenAI's ``/v1/audio/speech`` serves, encoded by PyAV (FFmpeg).

``mp3`` (the default), ``opus`` (Ogg), ``aac`` (ADTS), ``flac``, ``wav`` and ``pcm``
(headerless PCM16 mono little-endian at the server's output rate, ``X-Sample-Rate``).
Every format but FLAC streams: each chunk of speech goes out encoded as soon as the
encoder has a frame of it. FLAC's header holds the stream's length, so FLAC is sent
whole at the end; WAV streams with the "unknown length" header.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Literal

from ._audio import wav_header

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
ENCODED: tuple[SpeechFormat, ...] = ("mp3", "opus", "aac", "flac")
"""The formats PyAV encodes (``wav`` and ``pcm`` are PCM16 as it is)."""


@dataclass(frozen=True)
class _Codec:
    container: str
    codec: str
    mimetype: str
    rate_hz: int | None = None  # the rate the codec needs (None: the server's)
    streams: bool = True


_CODECS: dict[str, _Codec] = {
    "mp3": _Codec("mp3", "libmp3lame", "audio/mpeg"),
    "opus": _Codec("ogg", "libopus", "audio/ogg", rate_hz=48000),
    "aac": _Codec("adts", "aac", "audio/aac"),
    "flac": _Codec("flac", "flac", "audio/flac", streams=False),
}
MIMETYPES: dict[str, str] = {
    **{name: codec.mimetype for name, codec in _CODECS.items()},
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


class SpeechEncoder:
    """PCM16 mono in, ``format`` bytes out: ``feed`` each chunk, then ``close`` once."""

    def __init__(self, format: SpeechFormat, rate_hz: int) -> None:
        self.format = format
        self.rate_hz = rate_hz
        self._started = False
        codec = _CODECS.get(format)
        self._codec = codec
        if codec is None:
            return
        import av  # PyAV: installed with the voice extra (faster-whisper)

        self._av = av
        self._buffer = io.BytesIO()
        self._sent = 0
        self._container = av.open(self._buffer, mode="w", format=codec.container)
        out_rate_hz = codec.rate_hz or rate_hz
        self._stream = self._container.add_stream(codec.codec, rate=out_rate_hz)
        self._stream.layout = "mono"  # type: ignore[union-attr]
        self._resampler = av.AudioResampler(
            format=self._stream.format.name,  # type: ignore[union-attr]
            layout="mono",
            rate=out_rate_hz,
        )

    def feed(self, pcm16: bytes) -> bytes:
        if self._codec is None:
            header = b""
            if self.format == "wav" and not self._started:
                header = wav_header(self.rate_hz)
            self._started = True
            return header + pcm16
        if pcm16:
            import numpy as np

            samples = np.frombuffer(pcm16, dtype="<i2").reshape(1, -1)
            frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate = self.rate_hz
            for resampled in self._resampler.resample(frame):
                self._mux(resampled)
        return self._new_bytes() if self._codec.streams else b""

    def close(self) -> bytes:
        if self._codec is None:
            return self.feed(b"") if not self._started else b""
        for resampled in self._resampler.resample(None):
            self._mux(resampled)
        self._mux(None)
        self._container.close()
        if not self._codec.streams:
            return self._buffer.getvalue()
        return self._new_bytes()

    def _mux(self, frame: object) -> None:
        for packet in self._stream.encode(frame):  # type: ignore[union-attr,arg-type]
            self._container.mux(packet)

    def _new_bytes(self) -> bytes:
        data = self._buffer.getvalue()[self._sent :]
        self._sent += len(data)
        return data
