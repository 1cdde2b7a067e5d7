"""What objects look like on the wire, per dialect: items, the session, responses.

GA and beta differ in field names (``output_modalities`` / ``modalities``),
nesting (GA puts audio settings under ``audio``) and content part types
(GA ``output_text`` / ``output_audio``, beta ``text`` / ``audio``).
"""

from __future__ import annotations

from collections.abc import Mapping

from .._items import JsonValue
from ._config import Dialect, SessionConfig
from ._conversation import Item
from ._server_events import ServerEvent, named
from ._settings import Settings


def item_object(item: Item, dialect: Dialect) -> dict[str, JsonValue]:
    """A conversation item as conversation.item.* and response.output_item.* carry it."""
    if item.kind in ("function_call", "function_call_output"):
        call: dict[str, JsonValue] = {
            "id": item.id,
            "object": "realtime.item",
            "type": item.kind,
            "status": item.status,
            "call_id": item.call_id,
        }
        if item.kind == "function_call":
            return {**call, "name": item.name, "arguments": item.text or ""}
        return {**call, "output": item.text or ""}
    content: tuple[JsonValue, ...] = ()
    if item.status != "in_progress":
        content = (_content_part(item, dialect),)
    return {
        "id": item.id,
        "object": "realtime.item",
        "type": "message",
        "role": item.role,
        "status": item.status,
        "content": content,
    }


def _content_part(item: Item, dialect: Dialect) -> dict[str, JsonValue]:
    if item.role != "assistant":
        if item.kind == "audio":
            return {"type": "input_audio", "transcript": item.text}
        return {"type": "input_text", "text": item.text}
    kind = item.kind if dialect == "beta" else f"output_{item.kind}"
    return {"type": kind, ("text" if item.kind == "text" else "transcript"): item.text or ""}


def response_object(
    response_id: str,
    settings: Settings,
    config: SessionConfig,
    *,
    conversation_id: str,
    metadata: tuple[tuple[str, str], ...],
    status: str,
    status_details: Mapping[str, JsonValue] | None = None,
    output: tuple[JsonValue, ...] = (),
    usage: Mapping[str, JsonValue] | None = None,
) -> dict[str, JsonValue]:
    """A response as response.created / response.done carry it."""
    limit: JsonValue = "inf" if settings.max_output_tokens is None else settings.max_output_tokens
    shape: dict[str, JsonValue] = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": status_details,
        "output": output,
        "conversation_id": conversation_id,
        "max_output_tokens": limit,
        "metadata": dict(metadata) if metadata else None,
        "usage": usage,
    }
    if config.dialect == "beta":
        shape["modalities"] = settings.output_modalities
        shape["voice"] = settings.voice
        shape["output_audio_format"] = "pcm16"
        shape["temperature"] = settings.temperature
    else:
        shape["output_modalities"] = settings.output_modalities
        audio_format: dict[str, JsonValue] = {
            "type": "audio/pcm",
            "rate": config.output_sample_rate_hz,
        }
        shape["audio"] = {"output": {"format": audio_format, "voice": settings.voice}}
    return shape


def session_object(settings: Settings, config: SessionConfig) -> dict[str, JsonValue]:
    """The session as session.created / session.updated show it, in the session's dialect."""
    limit: JsonValue = "inf" if settings.max_output_tokens is None else settings.max_output_tokens
    detection = settings.turn_detection
    turn_detection: JsonValue = None if detection is None else detection.render()
    transcription: JsonValue = (
        None if settings.transcription is None else settings.transcription.render()
    )
    if config.dialect == "beta":
        # The beta SDK types ``model`` as a list of OpenAI model names: left out here.
        return {
            "id": config.session_id,
            "object": "realtime.session",
            "modalities": settings.output_modalities,
            "instructions": settings.instructions,
            "voice": settings.voice,
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "input_audio_transcription": transcription,
            "turn_detection": turn_detection,
            "tools": settings.tools_shape(),
            "tool_choice": settings.tool_choice_shape(),
            "temperature": settings.temperature,
            "max_response_output_tokens": limit,
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": config.session_id,
        "model": config.model,
        "output_modalities": settings.output_modalities,
        "instructions": settings.instructions,
        "max_output_tokens": limit,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": config.input_sample_rate_hz},
                "turn_detection": turn_detection,
                "transcription": transcription,
                "noise_reduction": None,
            },
            "output": {
                "format": {"type": "audio/pcm", "rate": config.output_sample_rate_hz},
                "voice": settings.voice,
                "speed": 1.0,
            },
        },
        "tools": settings.tools_shape(),
        "tool_choice": settings.tool_choice_shape(),
        "tracing": None,
    }


def item_events(
    item: Item, previous_item_id: str | None, dialect: Dialect, *, done: bool = True
) -> list[ServerEvent]:
    """The events that announce a new conversation item.

    GA: conversation.item.added, then conversation.item.done when the item is
    complete (``done``). Beta: conversation.item.created only.
    """
    fields: dict[str, JsonValue] = {
        "previous_item_id": previous_item_id,
        "item": item_object(item, dialect),
    }
    events = [named(dialect, "conversation.item.added", fields)]
    if done and dialect == "ga":
        events.append(ServerEvent("conversation.item.done", fields))
    return events


def item_done_event(
    item: Item, previous_item_id: str | None, dialect: Dialect
) -> list[ServerEvent]:
    """conversation.item.done for an item announced while in progress (GA only)."""
    if dialect == "beta":
        return []
    fields: dict[str, JsonValue] = {
        "previous_item_id": previous_item_id,
        "item": item_object(item, dialect),
    }
    return [ServerEvent("conversation.item.done", fields)]
