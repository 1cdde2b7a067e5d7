"""What goes into a pipeline (requests) and what comes out of it (user-visible items).

Everything here is a frozen value. Edge payloads — the tensors and frames that
travel from one stage to the next — are deliberately *not* defined here: they are
private to the pair of stages on an edge, and the runtime refuses to hand them to
a stream's client (see ``StageActor._check_output``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

Scalar = str | int | float | bool | None
JsonValue = Scalar | tuple["JsonValue", ...] | Mapping[str, "JsonValue"]


@dataclass(frozen=True)
class AudioInput:
    """Input audio: mono PCM16 little-endian samples at ``sample_rate_hz``."""

    pcm16: bytes
    sample_rate_hz: int


@dataclass(frozen=True)
class Request:
    """One stream's input, handed to every stage's ``open_stream``.

    ``options`` carries per-stream knobs (sampling parameters, speaker, ...) as
    plain scalars; each stage reads the ones it knows.
    """

    text: str = ""
    audio: AudioInput | None = None
    options: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Freeze a caller's dict so the request cannot change under a stage.
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


@dataclass(frozen=True)
class TextDelta:
    """A piece of generated text, in order."""

    text: str


@dataclass(frozen=True)
class AudioChunk:
    """A piece of generated audio: mono PCM16 little-endian samples."""

    pcm16: bytes
    sample_rate_hz: int

    @property
    def duration_s(self) -> float:
        return len(self.pcm16) / 2 / self.sample_rate_hz


@dataclass(frozen=True)
class Event:
    """A named, user-visible event (a transcript, a turn boundary, a trace)."""

    name: str
    data: Mapping[str, JsonValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.data, MappingProxyType):
            object.__setattr__(self, "data", MappingProxyType(dict(self.data)))


VisibleItem = TextDelta | AudioChunk | Event
VISIBLE_TYPES: tuple[type, ...] = (TextDelta, AudioChunk, Event)
