"""A transcription upload, decoded and checked, and its answer body: no sockets, no quart.

``prepare_transcription`` turns the form fields into a checked ``TranscriptionForm``
or raises ``BadRequest`` naming the field (a ``language`` other than the one the
pipeline's speech-recognition stage transcribes, ``timestamp_granularities`` without
``verbose_json``). ``decode_audio`` turns the upload, one of the formats the API
promises (``_audio_gate.py``), into the mono PCM16 the stream carries, in a decoder
process (``_decoders.py``). ``transcription_body`` turns the stage's
transcripts into the response body in the asked ``response_format``. The endpoint
(_transcriptions.py) only moves the bytes. Tested without a server
(tests/server/test_transcribe.py).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from ._audio_gate import OUT_RATE_HZ, DecodeLimits, UnsupportedAudio, sniff_demuxer
from ._requests import BadRequest, TranscriptionForm, parse_form
from ._settings import ServerSettings
from ._shares import ClientShares

DECODE_RATE_HZ = OUT_RATE_HZ


class UndecodableAudio(ValueError):
    """The upload is not audio the server takes (``_audio_gate.py`` says which)."""


class NoDecoder(RuntimeError):
    """This install has no audio decoder (PyAV comes with the voice extra)."""


async def decode_audio(
    data: bytes, settings: ServerSettings, shares: ClientShares, client: str, filename: str | None
) -> bytes:
    """An upload in one of the formats the API promises (``_audio_gate.py``: decided
    from its bytes; raw PCM16 at 24 kHz when its name ends in ``.pcm``), as mono PCM16
    at ``DECODE_RATE_HZ``, within the server's input-audio limits (checked as it
    decodes, so a long file is refused before it is all decoded). Decoded in one of
    the server's decoder processes, counted in ``client``'s share (``ShareExceeded``);
    cancelling this kills the decode. ``UndecodableAudio`` names what is wrong and
    nothing of the server's files."""
    if importlib.util.find_spec("av") is None:  # installed with faster-whisper
        raise NoDecoder("decoding uploads needs PyAV: install omnitrio's voice extra")
    declared_pcm = (filename or "").lower().endswith(".pcm")
    limits = DecodeLimits(
        settings.min_input_sample_rate_hz,
        settings.max_input_sample_rate_hz,
        settings.max_input_audio_s,
    )
    try:
        demuxer = sniff_demuxer(data, declared_pcm=declared_pcm)
        return await shares.decode(client, data, demuxer, limits)
    except UnsupportedAudio as exc:
        raise UndecodableAudio(str(exc)) from None


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
