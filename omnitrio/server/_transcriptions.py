"""``POST /v1/audio/transcriptions``: the pipeline's ASR stage behind OpenAI's endpoint.

The upload (multipart, field ``file``) is decoded with PyAV (FFmpeg: WAV, MP3, FLAC,
OGG/Opus, M4A, WebM ...) to mono PCM16 and sent down the pipeline as one stream
with option ``task: transcribe``: the ASR stage's ``transcript`` event is the
answer, and the stages after it do nothing for that stream (stages/voice/asr.py,
stages/voice/llm.py). ``response_format`` is ``json`` (the default), ``text`` or
``verbose_json``.

A pipeline serves the endpoint only if one of its stages declares the task in a
class attribute, ``tasks = ("transcribe",)`` (stages/voice/asr.py's ``WhisperAsr``
does). On any other pipeline the endpoint answers 404 at once, before the upload is
decoded, with an error naming the pipeline: the endpoint is not part of this
deployment's API, as vLLM serves only the endpoints its model supports. Before,
the stream ran through stages that ignore the task and the answer was 200 with an
empty text, which a client cannot tell from silence.
"""

from __future__ import annotations

import io
import itertools
import json
from functools import partial
from typing import Any

from quart import Response

from .._errors import OmnitrioError, Overloaded, PipelineClosed
from .._items import AudioInput, Event, Request
from .._options import ResponseOptions
from ..realtime import new_id
from ._audio import InputAudioError, check_input_audio, resample_pcm16
from ._capabilities import TRANSCRIBE_TASK as TASK
from ._capabilities import transcribing_stages, transcription_language
from ._http_errors import admit, bad_request, error_response, over_share, refused
from ._requests import BadRequest, TranscriptionForm, parse_form
from ._settings import ServerSettings
from ._shares import ShareExceeded
from ._state import ResponseLog, ServerState

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


async def transcriptions(state: ServerState, form: Any, files: Any, client: str) -> Response:
    config = state.pipeline.config
    if not transcribing_stages(config):
        message = (
            f"pipeline {config.pipeline.name!r} has no speech-recognition stage (no stage "
            f"declares tasks = ({TASK!r},)), so /v1/audio/transcriptions is not served here; "
            "serve a pipeline with one, such as configs/voice-chat.yaml"
        )
        return error_response(404, message, "unsupported_endpoint")
    upload = files.get("file")
    if upload is None:
        return error_response(
            400, "file: required (the audio to transcribe)", "invalid_request", "file"
        )
    try:
        fields = parse_form(TranscriptionForm, _form_fields(form))
    except BadRequest as exc:
        return bad_request(exc)
    language = transcription_language(config)
    if fields.language not in (None, language):
        message = (
            f"language: {fields.language[:16]!r} is not supported: this pipeline's "
            f"speech-recognition stage transcribes {language!r}"
        )
        return error_response(400, message, "unsupported_parameter", "language")
    if fields.timestamp_granularities and fields.response_format != "verbose_json":
        message = 'timestamp_granularities: needs response_format "verbose_json"'
        return error_response(400, message, "invalid_value", "timestamp_granularities")
    response_format = fields.response_format
    try:  # off the event loop: decoding a whole file takes a while
        pcm16 = await state.shares.off_loop(
            client, partial(decode_audio, upload.read(), state.settings)
        )
    except ShareExceeded as exc:
        return over_share(state, exc)
    except (UndecodableAudio, InputAudioError) as exc:
        return error_response(400, f"file: {exc}", "invalid_audio", "file")
    except NoDecoder as exc:
        return error_response(501, str(exc), "not_implemented")
    refusal = admit(state, client)
    if refusal is not None:
        return refusal
    request = Request(audio=AudioInput(pcm16, DECODE_RATE_HZ), options=ResponseOptions(task=TASK))
    log = ResponseLog(state, "transcription", new_id("trans"))
    texts: list[str] = []
    try:
        async with state.open_stream(client, request) as stream:
            async for item in stream:
                if isinstance(item, Event) and item.name == "transcript":
                    texts.append(str(item.data.get("text", "")))
    except (Overloaded, PipelineClosed) as exc:  # admitted after admit() looked: a race
        log.done("failed")
        return refused(state, exc)
    except ShareExceeded as exc:
        log.done("failed")
        return over_share(state, exc)
    except OmnitrioError as exc:
        log.done("failed")
        return error_response(500, str(exc), "pipeline_error")
    log.done("completed")
    text = " ".join(texts).strip()
    if response_format == "text":
        return Response(text + "\n", mimetype="text/plain")
    body: dict[str, Any] = {"text": text}
    if response_format == "verbose_json":
        duration_s = len(pcm16) / 2 / DECODE_RATE_HZ
        # One segment: the stage reports the utterance's text, not Whisper's segments.
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": duration_s, "text": text}
        body = {
            "task": "transcribe",
            "language": language,
            "duration": duration_s,
            "text": text,
            "segments": [segment] if text else [],
        }
    return Response(json.dumps(body), mimetype="application/json")


def _form_fields(form: Any) -> dict[str, object]:
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
