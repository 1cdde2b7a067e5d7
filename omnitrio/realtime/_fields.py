"""Typed reads of the JSON objects inside client events.

A client event arrives as plain data (dicts, lists, strings, numbers, and bytes
in msgpack framing). ``Fields`` wraps one object of it: every read checks the
type, names the full path of the key in the error it raises
(``session.audio.input.format``), and remembers the key, so that ``done()`` can
refuse the keys nobody read — a misspelt parameter is an error, not a no-op.
JSON ``null`` reads the same as an absent key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

from ._errors import ClientEventError, quote

T = TypeVar("T")


def type_name(value: object) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def check_text(value: str, param: str) -> str:
    """Refuse strings that cannot be encoded as UTF-8 (lone surrogates from JSON escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ClientEventError(
            "invalid_value", f"{param} is not valid Unicode (lone surrogate)", param=param
        ) from None
    return value


class Fields:
    """One JSON object of a client event, read key by key with types checked."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
            where = path or "the event"
            raise ClientEventError(
                "invalid_type",
                f"{where} must be an object with string keys, not {type_name(value)}",
                param=path or None,
            )
        self._object: Mapping[str, object] = value
        self._path = path
        self._read: set[str] = set()

    def param(self, key: str) -> str:
        """The full path of ``key``, as error events name it."""
        return f"{self._path}.{key}" if self._path else key

    def keys(self) -> list[str]:
        return list(self._object)

    def raw(self, key: str) -> object:
        """The value at ``key`` unchecked (``None`` when absent or null)."""
        self._read.add(key)
        return self._object.get(key)

    def _wrong_type(self, key: str, value: object, expected: str) -> ClientEventError:
        return ClientEventError(
            "invalid_type",
            f"{self.param(key)} must be {expected}, not {type_name(value)}",
            param=self.param(key),
        )

    def optional_str(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._wrong_type(key, value, "a string")
        return check_text(value, self.param(key))

    def required_str(self, key: str) -> str:
        value = self.optional_str(key)
        if value is None:
            raise self._missing(key)
        return value

    def optional_number(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong_type(key, value, "a number")
        if isinstance(value, int) and abs(value) > 2**53:  # float() would overflow or round
            raise ClientEventError(
                "invalid_value", f"{self.param(key)} is out of range", param=self.param(key)
            )
        if not math.isfinite(value):
            raise ClientEventError(
                "invalid_value", f"{self.param(key)} must be finite", param=self.param(key)
            )
        return float(value)

    def required_number(self, key: str) -> float:
        value = self.optional_number(key)
        if value is None:
            raise self._missing(key)
        return value

    def optional_array(self, key: str) -> list[object] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self._wrong_type(key, value, "an array")
        return value

    def optional_object(self, key: str) -> Fields | None:
        value = self.raw(key)
        return None if value is None else Fields(value, self.param(key))

    def required_object(self, key: str) -> Fields:
        value = self.optional_object(key)
        if value is None:
            raise self._missing(key)
        return value

    def _missing(self, key: str) -> ClientEventError:
        where = self.param(key)
        return ClientEventError(
            "missing_required_parameter", f"missing required parameter {where}", param=where
        )

    def choice(self, key: str, allowed: tuple[str, ...]) -> str | None:
        """A string that must be one of ``allowed`` (or absent)."""
        value = self.optional_str(key)
        if value is not None and value not in allowed:
            raise ClientEventError(
                "invalid_value",
                f"{self.param(key)} must be one of {', '.join(allowed)}, not {quote(value)}",
                param=self.param(key),
            )
        return value

    def unsupported_unless(self, key: str, ok: Callable[[object], bool], why: str) -> None:
        """Accept ``key`` only with a value that asks for nothing we lack; else refuse it."""
        value = self.raw(key)
        if value is not None and not ok(value):
            raise ClientEventError(
                "unsupported_parameter",
                f"{self.param(key)} is not supported: {why}",
                param=self.param(key),
            )

    def unread(self) -> list[ClientEventError]:
        """An error for each key that was not read: it is not a parameter of this object."""
        return [
            ClientEventError(
                "unknown_parameter",
                f"unknown parameter {quote(self.param(key))}",
                param=self.param(key)[:64],
            )
            for key in self._object
            if key not in self._read
        ]

    def done(self) -> None:
        """Refuse the first key that was not read."""
        for error in self.unread():
            raise error


class Problems:
    """The per-field errors of one session.update: a field that fails to parse is
    reported and left as it was, and the rest of the update still applies (so one
    unsupported knob does not silently drop the others)."""

    def __init__(self) -> None:
        self.errors: list[ClientEventError] = []

    def read(self, read: Callable[[], T | None]) -> T | None:
        """``read()``, or None (no change) after noting its error."""
        try:
            return read()
        except ClientEventError as error:
            self.errors.append(error)
            return None

    def done(self, fields: Fields) -> None:
        """Note every key of ``fields`` that nobody read."""
        self.errors.extend(fields.unread())
