"""A chat completions body, parsed and checked into a typed call: no sockets, no quart.

``prepare_chat`` takes the raw body and returns the ``ChatCall`` (the checked body
and the pipeline ``Request`` it asks for) or raises ``BadRequest`` naming the field:
the body's shape and caps (_requests.py), its messages turned into the pipeline's
``role: text`` lines, the audio of its last ``input_audio`` part (WAV, PCM16 mono),
its tools compiled (_tools.py), its voice among the pipeline's. The endpoint runs it
on a checking thread when the body could take a while (``is_costly``). Tested
without a server (tests/server/test_chat.py).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from .._items import AudioInput, Request
from .._options import ResponseOptions
from ..tools import arguments_json, call_text, with_tools
from ._audio import checked_input_audio
from ._capabilities import Voices
from ._requests import BadRequest, ChatRequest, check_chat, parse_json
from ._settings import ServerSettings
from ._tools import ChatToolError, chat_tools

INLINE_BODY_BYTES = 16 * 1024
"""A chat body this short, without tools or audio, is checked on the event loop."""


@dataclass(frozen=True)
class ChatCall:
    """A checked chat completions body and the pipeline request it asks for."""

    chat: ChatRequest
    request: Request


def is_costly(raw: bytes) -> bool:
    """Whether checking this body could hold the event loop for long (then a checking
    thread does it): tools to compile, audio to decode, a long body to parse. A false
    positive costs a thread hop."""
    return len(raw) > INLINE_BODY_BYTES or b'"tools"' in raw or b'"input_audio"' in raw


def prepare_chat(raw: bytes, settings: ServerSettings, voices: Voices) -> ChatCall:
    """The body parsed and checked, and its pipeline request. Raises ``BadRequest``."""
    chat = parse_json(ChatRequest, raw)
    check_chat(chat, settings)
    if "audio" in chat.modalities and chat.audio is None:
        raise BadRequest("audio: required when modalities include audio", "audio")
    if chat.audio is not None:
        why = voices.check(chat.audio.voice)
        if why is not None:
            raise BadRequest(f"audio.voice: {why}", "audio.voice", "invalid_value")
    try:
        return ChatCall(chat, _request_of(chat, settings))
    except _BadContent as exc:
        raise BadRequest(str(exc), exc.where, exc.code) from None


class _BadContent(ValueError):
    def __init__(self, where: str, problem: str, code: str = "unsupported_content") -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.code = code


def _request_of(chat: ChatRequest, settings: ServerSettings) -> Request:
    """The pipeline request: the messages as ``role: text`` lines, the audio of the last
    ``input_audio`` part, and the knobs as options. Raises ``_BadContent`` for content
    the pipeline cannot take."""
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
