"""OpenAI-compatible HTTP endpoints, chat completions and speech: the I/O glue only.

What a request means and what its answer looks like is sans-io, tested without a
server: the body is parsed and checked into a typed call (_chat.py, _speech.py;
a bad one raises ``BadRequest`` naming the field), the answer's items become the
response body or its server-sent events (_chat_answer.py, _speech.py), and errors
are data in OpenAI's shape (_api_errors.py). This module moves bytes: it checks a
costly body on a checking thread, admits the pipeline stream (an immediate 503 with
Retry-After when the pipeline is full or draining, 429 past the client's share),
reads the stream and logs the response.

Chat completions take ``tools`` and ``tool_choice`` (_tools.py), honour
``max_tokens`` / ``max_completion_tokens`` (``finish_reason`` "length" when the
answer was cut there) and report the LLM's token counts in ``usage`` (streamed too
with ``stream_options.include_usage``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from functools import partial
from typing import Any, cast

from quart import Response

from .._errors import OmnitrioError
from .._items import AudioChunk, TextDelta
from ._api_errors import needs_pyav_error, stream_error_chunk
from ._capabilities import pipeline_voices
from ._chat import ChatCall, is_costly, prepare_chat
from ._chat_answer import ChatAnswer, ChatItem
from ._http_errors import admit, bad_request, failure, over_share, respond
from ._requests import BadRequest
from ._shares import ShareExceeded
from ._speech import SpeechAudio, prepare_speech
from ._state import ResponseLog, ServerState
from ._tools import is_tool_event


async def chat_completions(state: ServerState, raw: bytes, client: str) -> Response:
    try:
        prepare = partial(prepare_chat, raw, state.settings, pipeline_voices(state.pipeline.config))
        call: ChatCall = (
            await state.shares.off_loop(client, prepare) if is_costly(raw) else prepare()
        )
    except BadRequest as exc:
        return bad_request(exc)
    except ShareExceeded as exc:
        return over_share(state, exc)
    try:
        answer = ChatAnswer(call.chat, state.model_name, state.settings.output_sample_rate_hz)
    except ImportError:
        assert call.chat.audio is not None  # only an encoded audio format needs PyAV
        return respond(needs_pyav_error("audio.format", call.chat.audio.format))
    log = ResponseLog(state, "chat.completion", answer.id)
    refusal = admit(state, client, call.request)
    if refusal is not None:
        return refusal

    async def opened() -> AsyncGenerator[ChatItem | None]:
        async with state.open_stream(client, call.request) as stream:
            yield None  # admitted: see below
            async for item in stream:
                if isinstance(item, AudioChunk | TextDelta) or is_tool_event(item):
                    yield item

    # The stream is admitted here, before the status is sent: ``admit`` is only a first
    # look, and many requests (one client's too) can pass it before any body starts.
    chunks = opened()
    refusal = await _open_first(state, chunks)
    if refusal is not None:
        return refusal
    items = cast(AsyncGenerator[ChatItem], chunks)  # past the None
    if call.chat.stream:
        return Response(_sse(answer, items, log), mimetype="text/event-stream")
    return await _whole(state, answer, items, log)


async def _open_first(state: ServerState, chunks: AsyncGenerator[Any]) -> Response | None:
    """Run ``chunks`` to its first yield, where its pipeline stream has opened: the
    response refusing it (the stream was not admitted), or None to send it."""
    try:
        await anext(chunks)
    except OmnitrioError as exc:
        await chunks.aclose()
        return failure(state, exc)
    return None


async def _sse(
    answer: ChatAnswer, items: AsyncGenerator[ChatItem], log: ResponseLog
) -> AsyncIterator[bytes]:
    yield answer.opening()
    try:
        async with aclosing(items):  # the pipeline stream closes with the response
            async for item in items:
                if isinstance(item, AudioChunk):
                    log.audio()
                for chunk in answer.chunks(item):
                    yield chunk
    except OmnitrioError as exc:
        log.done("failed")
        yield stream_error_chunk(exc)
        return
    except BaseException:  # cancelled or closed mid-stream: the client went away
        log.done("disconnected")
        raise
    log.done("completed")
    for chunk in answer.closing():
        yield chunk


async def _whole(
    state: ServerState, answer: ChatAnswer, items: AsyncGenerator[ChatItem], log: ResponseLog
) -> Response:
    try:
        async with aclosing(items):
            async for item in items:
                if isinstance(item, AudioChunk):
                    log.audio()
                answer.keep(item)
    except OmnitrioError as exc:  # a refusal after admit() looked (a race), or a failure
        log.done("failed")
        return failure(state, exc)
    log.done("completed")
    return Response(answer.body(), mimetype="application/json")


async def speech(state: ServerState, raw: bytes, client: str) -> Response:
    try:
        call = prepare_speech(raw, pipeline_voices(state.pipeline.config))
    except BadRequest as exc:
        return bad_request(exc)
    refusal = admit(state, client, call.request)
    if refusal is not None:
        return refusal
    try:
        audio = SpeechAudio(call, state.settings.output_sample_rate_hz)
    except ImportError:
        return respond(needs_pyav_error("response_format", call.speech.response_format))

    async def body() -> AsyncGenerator[bytes]:
        async with state.open_stream(client, call.request) as stream:
            yield b""  # admitted: see below
            async for item in stream:
                encoded = audio.take(item)
                if encoded:
                    yield encoded
            yield audio.close()

    # The stream is admitted here, before the status is sent: ``admit`` is only a
    # first look, and many requests can pass it before any of their bodies starts.
    chunks = body()
    refusal = await _open_first(state, chunks)
    if refusal is not None:
        return refusal
    response = Response(chunks, mimetype=call.mimetype)
    response.headers["X-Sample-Rate"] = str(audio.rate_hz)
    return response
