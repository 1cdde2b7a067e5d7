"""The trust boundary between a client's audio upload and FFmpeg: what it lets through.

An upload is opened only as one of the formats the API promises, decided from its
first bytes (never from its name, and never by FFmpeg's own probing, which would
pick any of its demuxers, the ones that open files, sockets and playlists among
them: concat/ffconcat, sdp, rtp, hls, dash, image2, tee):

====================  ==================================  ====================
format                first bytes                         FFmpeg demuxer
====================  ==================================  ====================
wav                   ``RIFF`` .... ``WAVE``              ``wav``
flac                  ``fLaC``                            ``flac``
ogg (opus, vorbis)    ``OggS``                            ``ogg``
mp3                   ``ID3`` tag or an MPEG audio frame  ``mp3``
aac (ADTS)            an ADTS frame (``FFF1`` / ``FFF9``) ``aac``
m4a / mp4             ``....ftyp``                        ``mov`` (drefs off)
webm / matroska       ``1A 45 DF A3``                     ``matroska``
pcm (declared only)   none: raw PCM16 mono at 24 kHz      ``s16le``
====================  ==================================  ====================

The demuxer is named to PyAV (``format=``) with ``protocol_whitelist`` "none", so a
demuxer that would open anything beside the bytes given (an mp4's data references)
fails instead; the decoded stream's codec must be one of ``CODECS``. Anything else
is ``unsupported audio format``, and no message says more than that (FFmpeg's own
text names paths and what exists there).

Decoding runs in a worker process (``_decoders.py`` starts it with this file as its
script: ``python -I _audio_gate.py``, so it imports PyAV, numpy and soxr and nothing
of the server). It answers one request at a time over its stdin/stdout (length-
prefixed frames, below) and is killed when a request runs past its time or is
cancelled, so a decode never holds a thread or shutdown. Its address space is capped
(``resource``), and it exits when its stdin closes.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from dataclasses import asdict, dataclass
from typing import BinaryIO

UNSUPPORTED = "unsupported audio format"
FORMATS = "wav, mp3, ogg/opus, flac, aac, m4a/mp4, webm"
PCM_RATE_HZ = 24000
"""A declared raw PCM upload: 16-bit little-endian mono at this rate (the OpenAI pcm16)."""
OUT_RATE_HZ = 16000
CODECS = frozenset(
    [
        "pcm_s16le",
        "pcm_s24le",
        "pcm_s32le",
        "pcm_u8",
        "pcm_f32le",
        "pcm_f64le",
        "pcm_mulaw",
        "pcm_alaw",
        "mp3",
        "mp3float",
        "opus",
        "libopus",
        "vorbis",
        "libvorbis",
        "flac",
        "aac",
        "aac_fixed",
    ]
)
"""Decoders an upload's audio stream may need (PyAV names the decoder, not the codec)."""

OK, REFUSED = 0, 1  # an answer's status byte
_HEAD = struct.Struct(">IQ")  # request: the limits' JSON length, the bytes' length
_ANSWER = struct.Struct(">BQ")  # answer: status, the payload's length


class UnsupportedAudio(ValueError):
    """The upload is not a format the API promises; the message names none of its bytes."""


@dataclass(frozen=True)
class DecodeLimits:
    """What one decode may produce: the input rates and duration the server takes."""

    min_rate_hz: int
    max_rate_hz: int
    max_audio_s: float


def sniff_demuxer(data: bytes, *, declared_pcm: bool = False) -> str:
    """The FFmpeg demuxer for ``data``, from its first bytes; ``UnsupportedAudio`` if
    it is none of ``FORMATS`` (or, ``declared_pcm``, the raw PCM the client named)."""
    head = data[:12]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[4:8] == b"ftyp":
        return "mov"
    frame = _after_id3(data)
    if len(frame) >= 2 and frame[0] == 0xFF and frame[1] & 0xE0 == 0xE0:
        layer = (frame[1] >> 1) & 0b11
        if layer == 0 and frame[1] & 0xF6 == 0xF0:
            return "aac"  # ADTS: MPEG-4/2 AAC, layer bits 00
        if layer != 0:
            return "mp3"  # MPEG audio layer I-III
    if frame is not data and frame[:4] == b"fLaC":
        return "flac"
    if declared_pcm:
        return "s16le"
    raise UnsupportedAudio(f"{UNSUPPORTED}: send one of {FORMATS} (or raw PCM16 as .pcm)")


def _after_id3(data: bytes) -> bytes:
    """``data`` after an ID3v2 tag (an mp3's, or an ADTS file's), or ``data`` itself."""
    if data[:3] != b"ID3" or len(data) < 10:
        return data
    size = 0
    for byte in data[6:10]:  # four 7-bit bytes
        size = (size << 7) | (byte & 0x7F)
    footer = 10 if data[5] & 0x10 else 0
    return data[10 + size + footer :]


def decode(data: bytes, demuxer: str, limits: DecodeLimits) -> bytes:
    """Mono PCM16 at ``OUT_RATE_HZ`` of ``data`` opened as ``demuxer`` (one of
    ``sniff_demuxer``'s answers). ``UnsupportedAudio`` for anything else or anything
    past ``limits`` (checked as it decodes: a long file stops early)."""
    import av  # in the worker only: the server process never opens client bytes
    import numpy as np
    import soxr

    if demuxer not in {"wav", "flac", "ogg", "matroska", "mov", "mp3", "aac", "s16le"}:
        raise UnsupportedAudio(UNSUPPORTED)
    options = {"protocol_whitelist": "none"}
    if demuxer == "mov":
        options |= {"enable_drefs": "0", "use_absolute_path": "0"}
    if demuxer == "s16le":
        options |= {"sample_rate": str(PCM_RATE_HZ), "ch_layout": "mono"}
    chunks: list[bytes] = []
    num_samples = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer, options=options) as container:
            if not container.streams.audio:
                raise UnsupportedAudio(f"{UNSUPPORTED}: the file has no audio stream")
            audio = container.streams.audio[0]
            rate_hz = int(getattr(audio, "rate", 0) or 0)
            if audio.codec_context.name not in CODECS or rate_hz <= 0:
                raise UnsupportedAudio(f"{UNSUPPORTED}: its audio codec is not one the API takes")
            _check(0, rate_hz, limits)
            to_mono = av.AudioResampler(format="s16", layout="mono", rate=rate_hz)
            for frame in [*container.decode(audio), None]:
                for out in to_mono.resample(frame):
                    chunk = out.to_ndarray().tobytes()
                    chunks.append(chunk)
                    num_samples += len(chunk) // 2
                _check(num_samples, rate_hz, limits)
    except av.FFmpegError:
        raise UnsupportedAudio(f"{UNSUPPORTED}: the file's audio could not be decoded") from None
    if not num_samples:
        raise UnsupportedAudio(f"{UNSUPPORTED}: the file holds no audio samples")
    samples = np.frombuffer(b"".join(chunks), dtype="<i2")
    if rate_hz != OUT_RATE_HZ:
        samples = np.asarray(soxr.resample(samples, rate_hz, OUT_RATE_HZ), dtype="<i2")
    return samples.tobytes()


def _check(num_samples: int, rate_hz: int, limits: DecodeLimits) -> None:
    if not limits.min_rate_hz <= rate_hz <= limits.max_rate_hz:
        raise UnsupportedAudio(
            f"the audio's sample rate {rate_hz} Hz is outside the supported "
            f"{limits.min_rate_hz}-{limits.max_rate_hz} Hz"
        )
    if num_samples / rate_hz > limits.max_audio_s:
        raise UnsupportedAudio(
            f"{num_samples / rate_hz:.1f} s of audio is over the limit of {limits.max_audio_s:g} s"
        )


def request_frame(data: bytes, demuxer: str, limits: DecodeLimits) -> bytes:
    """One request to the worker: the head, the limits and demuxer as JSON, the bytes."""
    meta = json.dumps({"demuxer": demuxer, **asdict(limits)}).encode()
    return _HEAD.pack(len(meta), len(data)) + meta + data


def answer_head(head: bytes) -> tuple[int, int]:
    """(status, payload length) of an answer's ``ANSWER_HEAD_BYTES`` first bytes."""
    status, length = _ANSWER.unpack(head)
    return status, length


ANSWER_HEAD_BYTES = _ANSWER.size


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer requests until stdin closes."""
    while head := stdin.read(_HEAD.size):
        if len(head) < _HEAD.size:
            return
        meta_len, data_len = _HEAD.unpack(head)
        meta = json.loads(stdin.read(meta_len))
        data = stdin.read(data_len)
        demuxer = meta.pop("demuxer")
        try:
            status, payload = OK, decode(data, demuxer, DecodeLimits(**meta))
        except UnsupportedAudio as exc:
            status, payload = REFUSED, str(exc).encode()
        stdout.write(_ANSWER.pack(status, len(payload)) + payload)
        stdout.flush()


def _main() -> None:
    import resource

    address_space_bytes = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import av  # warm: the first request does not wait for FFmpeg's libraries

    av.logging.set_level(None)
    _serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    _main()
