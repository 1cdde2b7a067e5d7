"""Frames in, plain data out; server events in, frames out. JSON or msgpack.

JSON framing is the OpenAI protocol: one event per text frame, audio as base64
strings. Msgpack framing carries the same event objects as msgpack maps in
binary frames, with audio as raw bytes: the ``delta`` of audio deltas from the
server, and (optionally) the ``audio`` of ``input_audio_buffer.append``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped]

from ._config import Framing
from ._errors import ClientEventError
from ._server_events import ServerEvent

# Errors the decoders raise on malformed input (UnicodeDecodeError, msgpack's
# ExtraData/FormatError/StackError and json's JSONDecodeError are ValueErrors;
# json raises RecursionError on deep nesting; msgpack raises TypeError on
# unhashable map keys).
_DECODE_ERRORS = (ValueError, TypeError, RecursionError, msgpack.exceptions.UnpackException)


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def decode_frame(
    frame: str | bytes, framing: Framing, max_message_bytes: int, max_values: int = 20_000
) -> object:
    """One WebSocket message as plain data; ``ClientEventError`` if it is not a valid frame.

    ``max_values`` bounds the work: a frame that holds more arrays, maps and elements
    is refused before (JSON) or while (msgpack) it is decoded, so one frame costs the
    event loop a few milliseconds at most, not the ~80 ms of a megabyte of empty maps.
    """
    _check_size(frame, max_message_bytes)
    if framing == "json":
        if not isinstance(frame, str):
            raise ClientEventError(
                "wrong_frame_type",
                "binary frame on a JSON session; send events as text frames "
                "(or ask for the omnitrio.msgpack.v1 subprotocol)",
            )
        if len(frame) > max_values:  # a shorter frame cannot hold more values
            _check_values(_json_values_bound(frame), max_values)
        try:
            return json.loads(frame, parse_constant=_refuse_constant)
        except _DECODE_ERRORS as error:
            raise ClientEventError("invalid_json", f"frame is not valid JSON: {error}") from None
    if not isinstance(frame, bytes):
        raise ClientEventError(
            "wrong_frame_type",
            "text frame on a msgpack session; send events as msgpack binary frames",
        )
    budget = _ValueBudget(max_values)
    try:
        return msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_array_len=max_values,
            max_map_len=max_values,
            object_hook=budget.container,
            list_hook=budget.container,
        )
    except ValueError as error:
        if "exceeds max_" in str(error):  # one array or map longer than max_values
            _check_values(max_values + 1, max_values)
        raise ClientEventError(
            "invalid_msgpack", f"frame is not valid msgpack: {type(error).__name__}"
        ) from None
    except _DECODE_ERRORS as error:
        raise ClientEventError(
            "invalid_msgpack", f"frame is not valid msgpack: {type(error).__name__}"
        ) from None


def _json_values_bound(frame: str) -> int:
    """An upper bound of the values in a JSON text: its ``,``, ``[`` and ``{`` outside
    strings (punctuation inside a string is text, not values). Linear and in C: the
    escapes that can hide a quote (``\\\\``, then ``\\"``) are dropped, and what is
    left splits at the quotes into outside (even) and inside (odd) parts."""
    outside = "".join(frame.replace("\\\\", "").replace('\\"', "").split('"')[0::2])
    return outside.count(",") + outside.count("[") + outside.count("{")


class _ValueBudget:
    """Counts the values of a msgpack frame as its arrays and maps are decoded."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.num_values = 0

    def container(self, value: Any) -> Any:
        self.num_values += len(value) + 1
        _check_values(self.num_values, self.max_values)
        return value


def _check_values(num_values: int, max_values: int) -> None:
    if num_values > max_values:
        raise ClientEventError(
            "message_too_large",
            f"frame holds more than {max_values} values (arrays, maps and their elements); "
            "a client event needs a few dozen",
        )


def _check_size(frame: str | bytes, max_message_bytes: int) -> None:
    if isinstance(frame, str):
        # A character is 1 to 4 bytes in UTF-8: only count the bytes when it matters.
        if len(frame) * 4 <= max_message_bytes:
            return
        size = len(frame) if len(frame) > max_message_bytes else _utf8_size(frame)
    else:
        size = len(frame)
    if size > max_message_bytes:
        raise ClientEventError(
            "message_too_large",
            f"frame of {size} bytes is over the limit of {max_message_bytes} bytes; "
            "send audio in smaller appends",
        )


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def decode_audio(value: object, param: str) -> bytes:
    """Audio from a client event: a base64 string, or raw bytes in msgpack framing."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ClientEventError(
            "invalid_type",
            f"{param} must be a base64 string (or binary in msgpack framing)",
            param=param,
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ClientEventError(
            "invalid_base64", f"{param} is not valid base64-encoded audio", param=param
        ) from None


def _plain(value: object) -> object:
    # Read-only mappings (MappingProxyType) are not dicts to json or msgpack.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode a {type(value).__name__} in a server event")


def encode_event(event: ServerEvent, event_id: str, framing: Framing) -> str | bytes:
    """``event`` as one WebSocket message, with ``event_id`` added."""
    message: dict[str, Any] = {"type": event.type, "event_id": event_id, **event.fields}
    if framing == "json":
        if event.audio is not None:
            message["delta"] = base64.b64encode(event.audio).decode("ascii")
        return json.dumps(
            message, default=_plain, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )
    if event.audio is not None:
        message["delta"] = event.audio
    packed: bytes = msgpack.packb(message, default=_plain, use_bin_type=True)
    return packed
