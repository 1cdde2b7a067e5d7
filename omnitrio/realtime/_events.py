"""Client events: parsed and validated into frozen values, or refused.

``parse_client_event`` takes one decoded frame and returns one of the event
classes below, or raises ``ClientEventError`` naming what is wrong. It reads
the GA shapes, or the beta shapes of session objects when the session's dialect
is beta; the event names are the same in both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ._config import SessionConfig
from ._conversation import ItemKind, Role
from ._encode import decode_audio
from ._errors import ClientEventError, quote
from ._fields import Fields
from ._parse_settings import parse_metadata, parse_response_params, parse_session
from ._settings import SettingsPatch


@dataclass(frozen=True)
class SessionUpdate:
    patch: SettingsPatch
    errors: tuple[ClientEventError, ...] = ()
    """The fields that were not applied, each to be reported in its own error event."""


@dataclass(frozen=True)
class AudioAppend:
    pcm16: bytes


@dataclass(frozen=True)
class AudioCommit:
    pass


@dataclass(frozen=True)
class AudioClear:
    pass


@dataclass(frozen=True)
class ItemCreate:
    item_id: str | None  # None: the server makes one
    role: Role
    text: str  # a message's text, a function call's arguments, or a call's output
    previous_item_id: str | None  # None: append; "root": insert first
    kind: ItemKind = "text"
    call_id: str | None = None  # function_call and function_call_output items
    name: str | None = None  # function_call items


@dataclass(frozen=True)
class ItemTruncate:
    item_id: str
    audio_end_ms: int  # the audio the client played; the transcript is cut to match


@dataclass(frozen=True)
class ItemDelete:
    item_id: str


@dataclass(frozen=True)
class ItemRetrieve:
    item_id: str


@dataclass(frozen=True)
class ResponseCreate:
    patch: SettingsPatch
    metadata: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ResponseCancel:
    response_id: str | None  # None: whichever response is active


@dataclass(frozen=True)
class OutputAudioClear:
    """WebRTC only: stop the answer's audio now (what was played stays, the rest is cut)."""


ClientEvent = (
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemTruncate
    | ItemDelete
    | ItemRetrieve
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear
)

# Events of the SDK's client event unions that omnitrio refuses, and why.
UNSUPPORTED_EVENTS: Mapping[str, str] = MappingProxyType(
    {
        "output_audio_buffer.clear": (
            "it is for WebRTC calls (POST /v1/realtime/calls); send response.cancel to stop a reply"
        ),
        "transcription_session.update": "transcription sessions are not available",
    }
)

_ROLES: Mapping[str, Role] = {"user": "user", "assistant": "assistant", "system": "system"}

# The content part type of a text message, by role and dialect.
_TEXT_PART = {
    ("user", "ga"): "input_text",
    ("system", "ga"): "input_text",
    ("assistant", "ga"): "output_text",
    ("user", "beta"): "input_text",
    ("system", "beta"): "input_text",
    ("assistant", "beta"): "text",
}


def _session_update(fields: Fields, config: SessionConfig) -> SessionUpdate:
    session = fields.required_object("session")
    patch, errors = parse_session(session, config)
    return SessionUpdate(patch, tuple(errors))


def _append(fields: Fields, config: SessionConfig) -> AudioAppend:
    value = fields.raw("audio")
    if value is None:
        raise ClientEventError(
            "missing_required_parameter", "missing required parameter audio", param="audio"
        )
    pcm16 = decode_audio(value, "audio")
    if len(pcm16) % 2:
        raise ClientEventError(
            "invalid_value",
            f"audio has {len(pcm16)} bytes; PCM16 audio comes in whole 2-byte samples",
            param="audio",
        )
    return AudioAppend(pcm16)


def _item_create(fields: Fields, config: SessionConfig) -> ItemCreate:
    previous_item_id = fields.optional_str("previous_item_id")
    item = fields.required_object("item")
    kind = item.required_str("type")
    if kind in ("function_call", "function_call_output"):
        return _call_item_create(item, kind, previous_item_id)
    if kind != "message":
        raise ClientEventError(
            "unsupported_parameter",
            f"item.type {quote(kind)} is not supported; message, function_call and "
            "function_call_output items are",
            param="item.type",
        )
    role = _ROLES.get(item.choice("role", tuple(_ROLES)) or "")
    if role is None:
        raise ClientEventError(
            "missing_required_parameter", "missing required parameter item.role", param="item.role"
        )
    item_id = item.optional_str("id")
    item.choice("object", ("realtime.item",))
    item.choice("status", ("completed", "incomplete", "in_progress"))  # has no effect
    parts = item.optional_array("content")
    if not parts:
        raise ClientEventError(
            "missing_required_parameter",
            "item.content must list the message's text",
            param="item.content",
        )
    part_type = _TEXT_PART[role, config.dialect]
    texts = [_text_part(part, f"item.content[{i}]", part_type) for i, part in enumerate(parts)]
    item.done()
    return ItemCreate(item_id, role, "\n".join(texts), previous_item_id)


def _call_item_create(item: Fields, kind: str, previous_item_id: str | None) -> ItemCreate:
    """A function_call item (the client replays one) or a function_call_output (a result)."""
    item_id = item.optional_str("id")
    item.choice("object", ("realtime.item",))
    item.choice("status", ("completed", "incomplete", "in_progress"))
    call_id = item.required_str("call_id")
    if kind == "function_call_output":
        output = item.required_str("output")
        item.done()
        return ItemCreate(
            item_id, "user", output, previous_item_id, "function_call_output", call_id
        )
    name = item.required_str("name")
    arguments = item.required_str("arguments")
    item.done()
    return ItemCreate(
        item_id, "assistant", arguments, previous_item_id, "function_call", call_id, name
    )


def _text_part(value: object, path: str, part_type: str) -> str:
    part = Fields(value, path)
    kind = part.required_str("type")
    if kind != part_type:
        why = "send input audio with input_audio_buffer.append and commit"
        raise ClientEventError(
            "unsupported_parameter",
            f"{path}.type {quote(kind)} is not supported here; only {part_type} is"
            + (f" ({why})" if kind == "input_audio" else ""),
            param=f"{path}.type",
        )
    text = part.required_str("text")
    part.done()
    return text


MAX_AUDIO_END_MS = 2**31 - 1
"""More than any item's audio (24 days); a larger number is refused, not echoed in full."""


def _item_truncate(fields: Fields, config: SessionConfig) -> ItemTruncate:
    item_id = fields.required_str("item_id")
    if fields.required_number("content_index") != 0:
        raise ClientEventError(
            "invalid_value", "content_index must be 0 (an item has one part)", param="content_index"
        )
    end_ms = fields.required_number("audio_end_ms")
    if not 0 <= end_ms <= MAX_AUDIO_END_MS or end_ms != int(end_ms):
        raise ClientEventError(
            "invalid_value",
            f"audio_end_ms must be a whole number of milliseconds from 0 to "
            f"{MAX_AUDIO_END_MS}, not {str(end_ms)[:24]}",
            param="audio_end_ms",
        )
    return ItemTruncate(item_id, int(end_ms))


def _response_create(fields: Fields, config: SessionConfig) -> ResponseCreate:
    params = fields.optional_object("response")
    if params is None:
        return ResponseCreate(SettingsPatch(), ())
    patch = parse_response_params(params, config)
    metadata = parse_metadata(params)
    params.done()
    return ResponseCreate(patch, metadata)


_PARSERS: Mapping[str, Callable[[Fields, SessionConfig], ClientEvent]] = MappingProxyType(
    {
        "session.update": _session_update,
        "input_audio_buffer.append": _append,
        "input_audio_buffer.commit": lambda fields, config: AudioCommit(),
        "input_audio_buffer.clear": lambda fields, config: AudioClear(),
        "conversation.item.create": _item_create,
        "conversation.item.truncate": _item_truncate,
        "conversation.item.delete": lambda fields, config: ItemDelete(
            fields.required_str("item_id")
        ),
        "conversation.item.retrieve": lambda fields, config: ItemRetrieve(
            fields.required_str("item_id")
        ),
        "response.create": _response_create,
        "response.cancel": lambda fields, config: ResponseCancel(
            fields.optional_str("response_id")
        ),
    }
)
SUPPORTED_EVENTS: tuple[str, ...] = tuple(_PARSERS)


MAX_EVENT_ID_CHARS = 256
"""A longer client ``event_id`` is not echoed in error events (it would be queued, one
copy per error, for a client that may not be reading)."""


def client_event_id(message: object) -> str | None:
    """The ``event_id`` of a decoded client event, if it has a usable one (for errors)."""
    if isinstance(message, dict):
        event_id = message.get("event_id")
        if isinstance(event_id, str) and len(event_id) <= MAX_EVENT_ID_CHARS:
            return event_id
    return None


def parse_client_event(message: object, config: SessionConfig) -> ClientEvent:
    """One decoded client event as a value; ``ClientEventError`` if it breaks the protocol."""
    if not isinstance(message, dict):
        raise ClientEventError("invalid_event", "a client event must be a JSON object")
    name = message.get("type")
    if not isinstance(name, str):
        raise ClientEventError("invalid_event", "a client event needs a string type", param="type")
    fields = Fields(message, "")
    fields.raw("type")
    event_id = fields.optional_str("event_id")
    if event_id is not None and len(event_id) > MAX_EVENT_ID_CHARS:
        raise ClientEventError(
            "invalid_value",
            f"event_id is {len(event_id)} characters, over the limit of {MAX_EVENT_ID_CHARS}",
            param="event_id",
        )
    parser = _PARSERS.get(name)
    if name == "output_audio_buffer.clear" and config.webrtc:
        parser = lambda fields, config: OutputAudioClear()  # noqa: E731
    if parser is None:
        if name in UNSUPPORTED_EVENTS:
            raise ClientEventError(
                "unsupported_event_type",
                f"{name} is not supported: {UNSUPPORTED_EVENTS[name]}",
                param="type",
            )
        raise ClientEventError(
            "unknown_event_type",
            f"unknown event type {quote(name)}; docs/protocol.md lists the supported events",
            param="type",
        )
    event = parser(fields, config)
    fields.done()
    return event
