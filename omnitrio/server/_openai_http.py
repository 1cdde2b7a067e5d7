"""OpenAI-compatible HTTP endpoints: chat completions (streaming and not) and speech.

Chat completions take ``tools`` and ``tool_choice`` (see _tools.py; a tool that breaks
omnitrio's rules, a schema the tool-call grammar cannot compile included, is a 400
naming ``tools.<i>.function.<field>`` before any stream is opened), honour
``max_tokens`` / ``max_completion_tokens`` (``finish_reason`` "length" when the
answer was cut there) and report the LLM's token counts in ``usage`` (streamed
too with ``stream_options.include_usage``).

Request bodies are validated by the models in _requests.py; a bad body is a 400 with an OpenAI-style
error object naming the field. Every response is one pipeline stream; overload is
an immediate 503 with Retry-After.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from functools import partial
from typing import Any, cast

from quart import Response

from .._answer import AnswerAssembler, CallArguments, CallStarted, Finished
from .._errors import OmnitrioError, Overloaded, PipelineClosed
from .._items import AudioChunk, AudioInput, Event, Request, TextDelta
from .._options import ResponseOptions
from ..realtime import new_id
from ..tools import (
    arguments_json,
    call_text,
    with_tools,
)
from ._audio import checked_input_audio, resample_pcm16, wav_bytes
from ._capabilities import pipeline_voices
from ._http_errors import admit, bad_request, error_response, over_share, refused
from ._requests import BadRequest, ChatRequest, SpeechRequest, check_chat, parse_json
from ._settings import ServerSettings
from ._shares import ShareExceeded
from ._speech_formats import ENCODED, MIMETYPES, SpeechEncoder
from ._state import ResponseLog, ServerState
from ._tools import ChatToolError, chat_tools, is_tool_event


def _unknown_voice(state: ServerState, voice: str, param: str) -> Response | None:
    """A 400 naming the choices when ``voice`` is not one of the pipeline's voices."""
    why = pipeline_voices(state.pipeline.config).check(voice)
    return None if why is None else error_response(400, f"{param}: {why}", "invalid_value", param)


class _BadContent(ValueError):
    def __init__(self, where: str, problem: str, code: str = "unsupported_content") -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.code = code


def _request_of(chat: ChatRequest, settings: ServerSettings) -> Request:
    """The pipeline request: the messages as ``role: text`` lines, the audio of the last
    ``input_audio`` part (WAV, PCM16 mono), and the knobs as options. Raises
    ``_BadContent`` for content the pipeline cannot take."""
    lines = []
    audio: AudioInput | None = None
    for index, message in enumerate(chat.messages):
        content = message.content
        if isinstance(content, list):
            texts = []
            for part_index, part in enumerate(content):
                where = f"messages.{index}.content.{part_index}"
                if part.get("type") == "text":
                    texts.append(str(part.get("text", "")))
                elif part.get("type") == "input_audio":
                    audio = _input_audio(part.get("input_audio"), where, settings)
                else:
                    raise _BadContent(where, f"content type {part.get('type')!r} is not supported")
            content = " ".join(texts)
        role = "system" if message.role == "developer" else message.role
        if message.role == "tool" and message.tool_call_id is None:
            raise _BadContent(f"messages.{index}.tool_call_id", "a tool message needs one")
        for call_index, call in enumerate(message.tool_calls or ()):
            where = f"messages.{index}.tool_calls.{call_index}.function.arguments"
            try:
                arguments = arguments_json(call.function.arguments)
            except ValueError as exc:
                raise _BadContent(where, str(exc)) from None
            content = f"{content or ''}{call_text(call.function.name, arguments)}"
        lines.append(f"{role}: {content or ''}")
    try:
        tools, choice = chat_tools(chat.tools, chat.tool_choice, settings.tool_limits)
    except ChatToolError as exc:
        raise _BadContent(exc.param, exc.problem, "invalid_value") from None
    options = ResponseOptions(
        modalities=tuple(chat.modalities),
        voice=chat.audio.voice if chat.audio else None,
        max_tokens=chat.max_completion_tokens or chat.max_tokens,
        temperature=chat.temperature,
        top_p=chat.top_p,
        seed=chat.seed,
    )
    return Request(text="\n".join(lines), audio=audio, options=with_tools(options, tools, choice))


def _input_audio(part: object, where: str, settings: ServerSettings) -> AudioInput:
    if not isinstance(part, dict) or part.get("format") != "wav":
        raise _BadContent(f"{where}.input_audio", "only format 'wav' (PCM16 mono) is supported")
    try:
        wav = base64.b64decode(str(part.get("data", "")), validate=True)
        pcm16, rate_hz = checked_input_audio(wav, settings)
    except (ValueError, binascii.Error) as exc:
        raise _BadContent(f"{where}.input_audio.data", str(exc)) from None
    return AudioInput(pcm16, rate_hz)


def _prepared(raw: bytes, settings: ServerSettings) -> tuple[ChatRequest, Request]:
    """The body parsed and checked, and its pipeline request (on a checking thread: a
    body's tools are compiled, its audio decoded). Raises ``BadRequest``."""
    parsed = parse_json(ChatRequest, raw)
    check_chat(parsed, settings)
    if "audio" in parsed.modalities and parsed.audio is None:
        raise BadRequest("audio: required when modalities include audio", "audio")
    try:
        return parsed, _request_of(parsed, settings)
    except _BadContent as exc:
        raise BadRequest(str(exc), exc.where, exc.code) from None


INLINE_BODY_BYTES = 16 * 1024
"""A chat body this short, without tools or audio, is checked on the event loop."""


def _costly(raw: bytes) -> bool:
    """Whether checking this body could hold the event loop for long (then a checking
    thread does it). A false positive costs a thread hop."""
    return len(raw) > INLINE_BODY_BYTES or b'"tools"' in raw or b'"input_audio"' in raw


async def chat_completions(state: ServerState, raw: bytes, client: str) -> Response:
    try:
        prepare = partial(_prepared, raw, state.settings)
        if _costly(raw):  # tools to compile, audio to decode, a long body to parse
            parsed, request = await state.shares.off_loop(client, prepare)
        else:
            parsed, request = prepare()
    except BadRequest as exc:
        return bad_request(exc)
    except ShareExceeded as exc:
        return over_share(state, exc)
    if parsed.audio is not None:
        wrong_voice = _unknown_voice(state, parsed.audio.voice, "audio.voice")
        if wrong_voice is not None:
            return wrong_voice
    try:
        completion = _Completion(state, parsed)
    except ImportError:
        assert parsed.audio is not None  # only an encoded audio format needs PyAV
        message = f"audio.format {parsed.audio.format!r} needs PyAV (the voice extra)"
        return error_response(501, message, "not_implemented", "audio.format")
    refusal = admit(state, client)
    if refusal is not None:
        return refusal

    async def opened() -> AsyncGenerator[AudioChunk | TextDelta | Event | None]:
        async with state.open_stream(client, request) as stream:
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
    items = cast(AsyncGenerator[AudioChunk | TextDelta | Event], chunks)  # past the None
    if parsed.stream:
        return Response(completion.sse(items), mimetype="text/event-stream")
    return await completion.whole(items)


async def _open_first(state: ServerState, chunks: AsyncGenerator[Any]) -> Response | None:
    """Run ``chunks`` to its first yield, where its pipeline stream has opened: the
    response refusing it (the stream was not admitted), or None to send it."""
    try:
        await anext(chunks)
    except (Overloaded, PipelineClosed) as exc:
        await chunks.aclose()
        return refused(state, exc)
    except ShareExceeded as exc:
        await chunks.aclose()
        return over_share(state, exc)
    return None


class _Completion:
    def __init__(self, state: ServerState, chat: ChatRequest) -> None:
        self.state = state
        self.chat = chat
        self.id = new_id("chatcmpl")
        self.audio_id = new_id("audio")
        self.created = int(time.time())
        self.audio = "audio" in chat.modalities
        self.rate_hz = state.settings.output_sample_rate_hz
        # Encoded formats (mp3, opus, aac, flac) by the speech endpoint's encoder, streamed
        # as one continuous file across the deltas; pcm16 and wav stream raw PCM16.
        format = chat.audio.format if chat.audio is not None else "pcm16"
        encoded = next((f for f in ENCODED if f == format), None)
        self.encoder = None if encoded is None else SpeechEncoder(encoded, self.rate_hz)
        self.log = ResponseLog(state, "chat.completion", self.id)
        self.answer = AnswerAssembler()

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return self._data({"choices": [choice]})

    def _data(self, fields: dict[str, Any]) -> bytes:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.state.model_name,
            **fields,
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    def finish_reason(self) -> str:
        finished = self.answer.finished
        if finished is not None and finished.finish_reason is not None:
            return finished.finish_reason
        return "tool_calls" if self.answer.calls else "stop"

    def usage(self) -> dict[str, int]:
        finished = self.answer.finished or Finished(None, None, None)
        prompt_tokens = finished.prompt_tokens or 0
        completion_tokens = finished.completion_tokens
        if completion_tokens is None:
            completion_tokens = self.answer.num_text_deltas
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _take(self, item: AudioChunk | TextDelta | Event) -> list[bytes]:
        """One pipeline item into the completion; the chunks to stream."""
        chunks = []
        for event in self.answer.take(item):
            if isinstance(event, CallStarted):
                function = {"name": event.name, "arguments": ""}
                call = {"index": event.index, "id": event.call_id, "type": "function"}
                chunks.append(self._chunk({"tool_calls": [{**call, "function": function}]}))
            elif isinstance(event, CallArguments):
                delta = {"index": event.index, "function": {"arguments": event.delta}}
                chunks.append(self._chunk({"tool_calls": [delta]}))
            elif isinstance(event, AudioChunk | TextDelta):
                chunks.append(self._delta(event))
        return chunks

    async def sse(
        self, items: AsyncGenerator[AudioChunk | TextDelta | Event]
    ) -> AsyncIterator[bytes]:
        yield self._chunk({"role": "assistant", "content": "" if not self.audio else None})
        try:
            async with aclosing(items):  # the pipeline stream closes with the response
                async for item in items:
                    for chunk in self._take(item):
                        yield chunk
        except OmnitrioError as exc:
            self.log.done("failed")
            error = {"error": {"message": str(exc), "type": "server_error"}}
            yield f"data: {json.dumps(error)}\n\n".encode()
            return
        except BaseException:  # cancelled or closed mid-stream: the client went away
            self.log.done("disconnected")
            raise
        self.log.done("completed")
        if self.encoder is not None:
            tail = self.encoder.close()
            if tail:
                yield self._audio_chunk(tail)
        yield self._chunk({}, finish=self.finish_reason())
        options = self.chat.stream_options
        if options is not None and options.include_usage:
            yield self._data({"choices": [], "usage": self.usage()})
        yield b"data: [DONE]\n\n"

    def _delta(self, item: AudioChunk | TextDelta) -> bytes:
        if isinstance(item, TextDelta):
            if self.audio:
                return self._chunk({"audio": {"id": self.audio_id, "transcript": item.text}})
            return self._chunk({"content": item.text})
        self.log.audio()
        pcm = resample_pcm16(item.pcm16, item.sample_rate_hz, self.rate_hz)
        data = pcm if self.encoder is None else self.encoder.feed(pcm)
        return self._audio_chunk(data)

    def _audio_chunk(self, data: bytes) -> bytes:
        return self._chunk(
            {"audio": {"id": self.audio_id, "data": base64.b64encode(data).decode()}}
        )

    async def whole(self, items: AsyncGenerator[AudioChunk | TextDelta | Event]) -> Response:
        text: list[str] = []
        pcm = bytearray()
        try:
            async with aclosing(items):
                async for item in items:
                    for event in self.answer.take(item):
                        if isinstance(event, TextDelta):
                            text.append(event.text)
                        elif isinstance(event, AudioChunk):
                            self.log.audio()
                            pcm += resample_pcm16(event.pcm16, event.sample_rate_hz, self.rate_hz)
        except (Overloaded, PipelineClosed) as exc:  # admitted after admit() looked: a race
            self.log.done("failed")
            return refused(self.state, exc)
        except ShareExceeded as exc:  # the same race, for the client's share
            self.log.done("failed")
            return over_share(self.state, exc)
        except OmnitrioError as exc:
            self.log.done("failed")
            return error_response(500, str(exc), "pipeline_error")
        self.log.done("completed")
        calls = self.answer.calls
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.audio or (calls and not text) else "".join(text),
        }
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        if self.audio:
            assert self.chat.audio is not None
            if self.encoder is not None:
                audio = self.encoder.feed(bytes(pcm)) + self.encoder.close()
            elif self.chat.audio.format == "wav":
                audio = wav_bytes(bytes(pcm), self.rate_hz)
            else:
                audio = bytes(pcm)
            message["audio"] = {
                "id": self.audio_id,
                "data": base64.b64encode(audio).decode(),
                "transcript": "".join(text),
                "expires_at": self.created + 3600,
            }
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason()}
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": [choice],
            "usage": self.usage(),
        }
        return Response(json.dumps(body), mimetype="application/json")


async def speech(state: ServerState, raw: bytes, client: str) -> Response:
    try:
        parsed = parse_json(SpeechRequest, raw)
    except BadRequest as exc:
        return bad_request(exc)
    wrong_voice = _unknown_voice(state, parsed.voice, "voice")
    if wrong_voice is not None:
        return wrong_voice
    # task "speak": say ``text`` as it is (a pipeline that answers would answer it instead).
    options = ResponseOptions(modalities=("audio",), voice=parsed.voice, task="speak")
    request = Request(text=parsed.input, options=options)
    refusal = admit(state, client)
    if refusal is not None:
        return refusal
    rate_hz = state.settings.output_sample_rate_hz
    try:
        encoder = SpeechEncoder(parsed.response_format, rate_hz)
    except ImportError:
        message = f"response_format {parsed.response_format!r} needs PyAV (the voice extra)"
        return error_response(501, message, "not_implemented", "response_format")

    async def body() -> AsyncGenerator[bytes]:
        async with state.open_stream(client, request) as stream:
            yield b""  # admitted: see below
            async for item in stream:
                if isinstance(item, AudioChunk):
                    pcm = resample_pcm16(item.pcm16, item.sample_rate_hz, rate_hz)
                    encoded = encoder.feed(pcm)
                    if encoded:
                        yield encoded
            yield encoder.close()

    # The stream is admitted here, before the status is sent: ``admit`` is only a
    # first look, and many requests can pass it before any of their bodies starts.
    chunks = body()
    refusal = await _open_first(state, chunks)
    if refusal is not None:
        return refusal
    response = Response(chunks, mimetype=MIMETYPES[parsed.response_format])
    response.headers["X-Sample-Rate"] = str(rate_hz)
    return response
