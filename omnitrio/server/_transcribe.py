"""A transcription upload, decoded and checked, and its answer body: no sockets, no quart.

``prepare_transcription`` turns the form fields into a checked ``TranscriptionForm``
or raises ``BadRequest`` naming the field (a ``language`` other than the one the
pipeline's speech-recognition stage transcribes, ``timestamp_granularities`` without
``verbose_json``). ``decode_audio`` turns the upload, any audio FFmpeg reads, into
the mono PCM16 the stream carries. ``transcription_body`` turns the stage's
transcripts into the response body in the asked ``response_format``. The endpoint
(_transcriptions.py) only moves the bytes. Tested without a server
(tests/server/test_transcribe.py).
"""

from __future__ import annotations

import io
import itertools
import json
from typing import Any

from ._audio import InputAudioError, check_input_audio, resample_pcm16
from ._requests import BadRequest, TranscriptionForm, parse_form
from ._settings import ServerSettings

DECODE_RATE_HZ = 16000


class UndecodableAudio(ValueError):
    """The upload is not audio FFmpeg can read."""


class NoDecoder(RuntimeError):
    """This install has no audio decoder (PyAV comes with the voice extra)."""


def decode_audio(data: bytes, settings: ServerSettings) -> bytes:
    """Any audio file FFmpeg reads, as mono PCM16 at ``DECODE_RATE_HZ``, within the
    server's input-audio limits (``check_input_audio``: the rate, and the duration,
    checked as it decodes so a long file is refused before it is all decoded). The
    rate change is omnitrio's one resampler (soxr), as for every other upload."""
    try:
        import av  # installed with faster-whisper (the voice extra)
    except ImportError:
        raise NoDecoder("decoding uploads needs PyAV: install omnitrio's voice extra") from None

    pcm = bytearray()
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise UndecodableAudio("the file has no audio stream")
            audio = container.streams.audio[0]
            # A stream FFmpeg found no codec for (a WAV of 0 bits per sample) has no rate.
            rate_hz = int(getattr(audio, "rate", 0) or 0)
            if rate_hz <= 0:
                raise UndecodableAudio("the file's audio stream has no codec FFmpeg can decode")
            check_input_audio(0, rate_hz, settings)
            to_mono_s16 = av.AudioResampler(format="s16", layout="mono", rate=rate_hz)
            frames = itertools.chain(container.decode(audio), [None])
            for frame in frames:
                for out in to_mono_s16.resample(frame):
                    pcm += out.to_ndarray().tobytes()
                check_input_audio(len(pcm) // 2, rate_hz, settings)
    except (av.FFmpegError, ValueError) as exc:  # FFmpegError: not audio at all
        if isinstance(exc, InputAudioError):
            raise
        raise UndecodableAudio(f"cannot decode the file as audio ({exc})") from None
    if not pcm:
        raise UndecodableAudio("the file holds no audio samples")
    return resample_pcm16(bytes(pcm), rate_hz, DECODE_RATE_HZ)


def prepare_transcription(fields: dict[str, object], language: str) -> TranscriptionForm:
    """The form's fields checked, for a stage that transcribes ``language``. Raises
    ``BadRequest`` naming the field."""
    form = parse_form(TranscriptionForm, fields)
    if form.language not in (None, language):
        message = (
            f"language: {form.language[:16]!r} is not supported: this pipeline's "
            f"speech-recognition stage transcribes {language!r}"
        )
        raise BadRequest(message, "language", "unsupported_parameter")
    if form.timestamp_granularities and form.response_format != "verbose_json":
        message = 'timestamp_granularities: needs response_format "verbose_json"'
        raise BadRequest(message, "timestamp_granularities", "invalid_value")
    return form


def transcription_body(
    form: TranscriptionForm, language: str, texts: list[str], num_samples: int
) -> tuple[bytes, str]:
    """The response body (and its mimetype) for the stage's transcripts ``texts`` of
    ``num_samples`` decoded samples (at ``DECODE_RATE_HZ``)."""
    text = " ".join(texts).strip()
    if form.response_format == "text":
        return (text + "\n").encode(), "text/plain"
    body: dict[str, Any] = {"text": text}
    if form.response_format == "verbose_json":
        duration_s = num_samples / DECODE_RATE_HZ
        # One segment: the stage reports the utterance's text, not Whisper's segments.
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": duration_s, "text": text}
        body = {
            "task": "transcribe",
            "language": language,
            "duration": duration_s,
            "text": text,
            "segments": [segment] if text else [],
        }
    return json.dumps(body).encode(), "application/json"


def form_fields(form: Any) -> dict[str, object]:
    """A multipart form as model fields: ``name[]`` (repeated) as the list ``name``, and
    ``name[key]`` as the object ``name`` (the SDK's encoding of lists and objects)."""
    fields: dict[str, object] = {}
    for key in form:
        name, _, rest = key.partition("[")
        if rest == "]":
            fields[name] = form.getlist(key)
        elif rest:
            inner = fields.setdefault(name, {})
            if isinstance(inner, dict):
                inner[rest.rstrip("]")] = form.get(key)
        else:
            fields[key] = form.get(key)
    return fields
