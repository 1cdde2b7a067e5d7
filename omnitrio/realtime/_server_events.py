"""Server events as values, and the names each dialect gives them."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._items import JsonValue
from ._config import Dialect
from ._errors import ClientEventError

# GA name -> the older beta name, where the beta SDK knows the event by another name.
_BETA_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "response.output_text.delta": "response.text.delta",
        "response.output_text.done": "response.text.done",
        "response.output_audio.delta": "response.audio.delta",
        "response.output_audio.done": "response.audio.done",
        "response.output_audio_transcript.delta": "response.audio_transcript.delta",
        "response.output_audio_transcript.done": "response.audio_transcript.done",
        "conversation.item.added": "conversation.item.created",
    }
)


@dataclass(frozen=True)
class ServerEvent:
    """One event for the client, before encoding.

    ``fields`` is everything but ``type``, ``event_id`` (added by ``encode``) and
    the audio of an audio delta, which travels in ``audio`` as raw PCM16 and is
    encoded as base64 ``delta`` in JSON framing, raw bytes in msgpack framing.
    """

    type: str
    fields: Mapping[str, JsonValue] = field(default_factory=dict)
    audio: bytes | None = None

    def __post_init__(self) -> None:
        reserved = {"type", "event_id"} | ({"delta"} if self.audio is not None else set())
        if clash := reserved & set(self.fields):
            raise ValueError(f"ServerEvent.fields must not hold {sorted(clash)}")
        if not isinstance(self.fields, MappingProxyType):
            object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))


def named(
    dialect: Dialect, ga_name: str, fields: Mapping[str, JsonValue], audio: bytes | None = None
) -> ServerEvent:
    """A server event under the name ``dialect`` uses for the GA event ``ga_name``."""
    name = _BETA_NAMES.get(ga_name, ga_name) if dialect == "beta" else ga_name
    return ServerEvent(name, fields, audio)


def new_id(prefix: str) -> str:
    """A fresh id such as ``event_3f2a...`` (96 random bits: unique without coordination)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def safe_text(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry (lone surrogates) replaced by "?"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def error_event(error: ClientEventError, client_event_id: str | None) -> ServerEvent:
    """The ``error`` event for a client event that broke the protocol."""
    return ServerEvent(
        "error",
        {
            "error": {
                "type": "invalid_request_error",
                "code": error.code,
                "message": safe_text(error.message),
                "param": None if error.param is None else safe_text(error.param),
                "event_id": None if client_event_id is None else safe_text(client_event_id),
            }
        },
    )
