"""What goes into a pipeline (requests) and what comes out of it (user-visible items).

Everything here is a frozen value. Edge payloads — the tensors and frames that
travel from one stage to the next — are deliberately *not* defined here: they are
private to the pair of stages on an edge, and the runtime refuses to hand them to
a stream's client (see ``_contract.check_output``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._options import ResponseOptions
from ._options import Scalar as Scalar

JsonValue = Scalar | tuple["JsonValue", ...] | Mapping[str, "JsonValue"]


@dataclass(frozen=True)
class AudioInput:
    """Input audio: mono PCM16 little-endian samples at ``sample_rate_hz``."""

    pcm16: bytes
    sample_rate_hz: int


@dataclass(frozen=True, init=False)
class Request:
    """One stream's input, handed to every stage's ``open_stream``.

    ``options`` are the response's options (``ResponseOptions``: typed fields, and
    knobs private to stages); a plain mapping is read by
    ``ResponseOptions.from_mapping`` (``{"max_tokens": 8, "talker.max_tokens": 20}``),
    which refuses a known option of the wrong type with a ``ValueError`` naming it.
    """

    text: str
    audio: AudioInput | None
    options: ResponseOptions

    def __init__(
        self,
        text: str = "",
        audio: AudioInput | None = None,
        options: ResponseOptions | Mapping[str, Scalar] | None = None,
    ) -> None:
        if options is None:
            options = ResponseOptions()
        elif not isinstance(options, ResponseOptions):
            options = ResponseOptions.from_mapping(options)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "audio", audio)
        object.__setattr__(self, "options", options)


@dataclass(frozen=True)
class TextDelta:
    """A piece of generated text, in order."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"TextDelta.text must be a str, not {type(self.text).__name__}")


@dataclass(frozen=True)
class AudioChunk:
    """A piece of generated audio: mono PCM16 little-endian samples."""

    pcm16: bytes
    sample_rate_hz: int

    def __post_init__(self) -> None:
        if not isinstance(self.pcm16, bytes):
            raise TypeError(f"AudioChunk.pcm16 must be bytes, not {type(self.pcm16).__name__}")
        if not isinstance(self.sample_rate_hz, int) or self.sample_rate_hz <= 0:
            raise ValueError(
                f"AudioChunk.sample_rate_hz must be a positive int, not {self.sample_rate_hz!r}"
            )

    @property
    def duration_s(self) -> float:
        return len(self.pcm16) / 2 / self.sample_rate_hz


@dataclass(frozen=True)
class Event:
    """A named, user-visible event (a transcript, a turn boundary, a trace)."""

    name: str
    data: Mapping[str, JsonValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_json("Event.data", self.data)
        if not isinstance(self.data, MappingProxyType):
            object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    def __reduce__(self) -> tuple[type[Event], tuple[str, dict[str, JsonValue]]]:
        # A frozen mapping does not pickle; a Ray-placed stage sends events by pickle.
        return (Event, (self.name, dict(self.data)))


def _check_json(where: str, value: object) -> None:
    """Event data is plain data (what a client can be sent), never a tensor or handle."""
    if value is None or isinstance(value, str | int | float | bool):
        return
    if isinstance(value, tuple | list):
        for index, inner in enumerate(value):
            _check_json(f"{where}[{index}]", inner)
        return
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} keys must be str, not {type(key).__name__}")
            _check_json(f"{where}.{key}", inner)
        return
    raise TypeError(
        f"{where} is a {type(value).__name__}; events carry JSON-like data only "
        "(send tensors to the next stage as payloads)"
    )


VisibleItem = TextDelta | AudioChunk | Event
VISIBLE_TYPES: tuple[type, ...] = (TextDelta, AudioChunk, Event)
