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

from typing import Any

from quart import Response

from .._errors import OmnitrioError
from .._items import AudioInput, Event, Request
from .._options import ResponseOptions
from ..realtime import new_id
from ._audio import InputAudioError
from ._capabilities import TRANSCRIBE_TASK as TASK
from ._capabilities import transcribing_stages, transcription_language
from ._http_errors import admit, bad_request, error_response, failure, over_share
from ._requests import BadRequest
from ._shares import ShareExceeded
from ._state import ResponseLog, ServerState
from ._transcribe import (
    DECODE_RATE_HZ,
    NoDecoder,
    UndecodableAudio,
    decode_audio,
    form_fields,
    prepare_transcription,
    transcription_body,
)


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
    language = transcription_language(config)
    try:
        fields = prepare_transcription(form_fields(form), language)
    except BadRequest as exc:
        return bad_request(exc)
    try:  # in a decoder process (_decoders.py): a whole file takes a while
        pcm16 = await decode_audio(
            upload.read(), state.settings, state.shares, client, upload.filename
        )
    except ShareExceeded as exc:
        return over_share(state, exc)
    except (UndecodableAudio, InputAudioError) as exc:
        return error_response(400, f"file: {exc}", "invalid_audio", "file")
    except NoDecoder as exc:
        return error_response(501, str(exc), "not_implemented")
    request = Request(audio=AudioInput(pcm16, DECODE_RATE_HZ), options=ResponseOptions(task=TASK))
    refusal = admit(state, client, request)  # asked for a transcription: it plays no audio
    if refusal is not None:
        return refusal
    log = ResponseLog(state, "transcription", new_id("trans"))
    texts: list[str] = []
    try:
        async with state.open_stream(client, request) as stream:
            async for item in stream:
                if isinstance(item, Event) and item.name == "transcript":
                    texts.append(str(item.data.get("text", "")))
    except OmnitrioError as exc:  # a refusal after admit() looked (a race), or a failure
        log.done("failed")
        return failure(state, exc)
    log.done("completed")
    body, mimetype = transcription_body(fields, language, texts, len(pcm16) // 2)
    return Response(body, mimetype=mimetype)
