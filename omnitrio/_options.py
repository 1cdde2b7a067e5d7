"""A response's options, typed: what both API dialects ask of a pipeline's stages.

``ResponseOptions`` is the one shape a request's knobs travel in. The HTTP dialect
(chat completions, speech, transcriptions) and the Realtime dialect
(``response.create`` and the session) both build it; stages read its fields
(``options.max_tokens``, ``options.modalities``), never a string key. What is private
to one stage (``talker.max_tokens``, a fault plan's ``fault.hang_at``, a turn
detector's ``silence_duration_ms``, a synthetic stage's ``steps``) goes in ``knobs``,
an explicit mapping of scalars that the stage checks itself.

For the Python API a plain mapping still works: ``Request("hi", options={"max_tokens":
8, "talker.max_tokens": 20})`` is read by ``ResponseOptions.from_mapping`` (the known
keys into fields, checked; the rest into ``knobs``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, cast, get_args

__all__ = [
    "FunctionTool",
    "Modality",
    "ResponseOptions",
    "ToolChoice",
    "ToolMode",
    "empty_parameters",
]

Scalar = str | int | float | bool | None
Modality = Literal["text", "audio"]
MODALITIES: tuple[Modality, ...] = get_args(Modality)
ToolMode = Literal["auto", "none", "required"]
TOOL_MODES: tuple[ToolMode, ...] = get_args(ToolMode)


def empty_parameters() -> dict[str, Any]:
    """The parameters schema of a function that takes none (a tool that names none)."""
    return {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """A function the model may call; ``parameters`` is its arguments' JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=empty_parameters)

    def described(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@dataclass(frozen=True)
class ToolChoice:
    """``auto``, ``none``, ``required``, or a named function (``required`` with ``name``)."""

    mode: ToolMode = "auto"
    name: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in TOOL_MODES:
            raise ValueError(
                f"request option 'tool_choice' must be one of {TOOL_MODES}, not {self.mode!r}"
            )
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"request option 'tool_name' must be a str, not {self.name!r}")


_NUMBERS = ("speed", "temperature", "top_p")
_INTS = ("max_tokens", "seed")
_STRS = ("voice", "instructions", "task")


@dataclass(frozen=True)
class ResponseOptions:
    """One response's options (None: the stage's own default).

    ``modalities``: what the answer holds (``("text",)``, ``("audio",)`` or both);
    ``voice`` and ``speed`` for the speech; ``max_tokens``, ``temperature``, ``top_p``
    and ``seed`` for the text model's sampling; ``instructions`` replace the model's
    system prompt; ``tools`` and ``tool_choice`` for function calling (see
    omnitrio/tools.py); ``task`` asks a stage for something other than an answer
    (``speak``: say ``Request.text`` as it is; ``transcribe``: only the transcript).
    ``knobs`` are the knobs private to stages, by name (``<stage>.<key>`` for one
    stage's, or a key a stage documents); each stage checks the ones it reads.
    Ranges (a ``top_p`` in (0, 1]) are the stages' to check; types are checked here,
    and a wrong one is a ``ValueError`` naming the option.
    """

    modalities: tuple[Modality, ...] | None = None
    voice: str | None = None
    speed: float | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    instructions: str | None = None
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    task: str | None = None
    knobs: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _NUMBERS:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ValueError(f"request option {name!r} must be a number, not {value!r:.40}")
        for name in _INTS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(
                    f"request option {name!r} must be a whole number, not {value!r:.40}"
                )
        for name in _STRS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"request option {name!r} must be a str, not {value!r:.40}")
        if self.modalities is not None:
            object.__setattr__(self, "modalities", tuple(self.modalities))
            for modality in cast(tuple[object, ...], self.modalities):
                if modality not in MODALITIES:
                    raise ValueError(
                        f"request option 'modalities' must list {' or '.join(MODALITIES)}, "
                        f"not {modality!r:.40}"
                    )
        object.__setattr__(self, "tools", tuple(self.tools))
        if not all(isinstance(t, FunctionTool) for t in self.tools):
            raise ValueError("request option 'tools' must hold FunctionTool values")
        if not isinstance(self.tool_choice, ToolChoice):
            raise ValueError(
                f"request option 'tool_choice' must be a ToolChoice, not {self.tool_choice!r:.40}"
            )
        if not isinstance(self.knobs, MappingProxyType):
            object.__setattr__(self, "knobs", MappingProxyType(dict(self.knobs)))
        for key, value in self.knobs.items():
            if not isinstance(key, str):
                raise ValueError(f"a request knob's name must be a str, not {key!r:.40}")
            if value is not None and not isinstance(value, str | int | float | bool):
                raise ValueError(f"request knob {key!r} must be a scalar, not {value!r:.40}")

    def __reduce__(self) -> tuple[type[ResponseOptions], tuple[object, ...]]:
        # A frozen mapping does not pickle; a Ray-placed stage receives options by pickle.
        values = [getattr(self, f.name) for f in fields(self)]
        values[-1] = dict(self.knobs)
        return (ResponseOptions, tuple(values))

    def wants(self, modality: Modality) -> bool:
        """Whether the answer holds ``modality`` (unset modalities hold everything)."""
        return self.modalities is None or modality in self.modalities

    @classmethod
    def from_mapping(cls, options: Mapping[str, Scalar]) -> ResponseOptions:
        """Options from a flat mapping (the Python API's spelling; ``as_mapping`` is its
        inverse): ``modalities`` (or ``output_modalities``) comma-separated, ``tools`` a
        JSON list of ``{"name", "description", "parameters"}``, ``tool_choice`` a mode
        and ``tool_name`` the function it forces; any other key is a knob."""
        values: dict[str, Any] = {}
        knobs: dict[str, Scalar] = {}
        for key, value in options.items():
            if key in ("modalities", "output_modalities"):
                if value is not None:
                    if not isinstance(value, str):
                        raise ValueError(f"request option {key!r} must be a str, not {value!r:.40}")
                    values["modalities"] = tuple(m for m in value.split(",") if m)
            elif key in _NUMBERS + _INTS + _STRS:
                if value is not None:
                    values[key] = value
            elif key not in ("tools", "tool_choice", "tool_name"):
                knobs[key] = value
        mode, name = options.get("tool_choice"), options.get("tool_name")
        values["tool_choice"] = ToolChoice(
            cast(ToolMode, "auto" if mode is None else mode),
            None if name is None else str(name),
        )
        if options.get("tools") is not None:
            values["tools"] = _tools_of(options["tools"])
        return cls(**values, knobs=knobs)

    def as_mapping(self) -> dict[str, Scalar]:
        """The options as a flat mapping of scalars (read back by ``from_mapping``)."""
        flat: dict[str, Scalar] = {}
        if self.modalities is not None:
            flat["modalities"] = ",".join(self.modalities)
        for name in _NUMBERS + _INTS + _STRS:
            if getattr(self, name) is not None:
                flat[name] = getattr(self, name)
        if self.tools:
            flat["tools"] = json.dumps([t.described() for t in self.tools])
        if self.tool_choice != ToolChoice():
            flat["tool_choice"] = self.tool_choice.mode
            if self.tool_choice.name is not None:
                flat["tool_name"] = self.tool_choice.name
        flat.update(self.knobs)
        return flat


def _tools_of(raw: Scalar) -> tuple[FunctionTool, ...]:
    try:
        listed = json.loads(str(raw))
        return tuple(
            FunctionTool(
                str(t["name"]),
                str(t.get("description") or ""),
                dict(t.get("parameters") or empty_parameters()),
            )
            for t in listed
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"request option 'tools' must be a JSON list of functions: {exc}"
        ) from None
