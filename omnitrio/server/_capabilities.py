"""What a pipeline offers the API, read from its config: what its stage classes
declare (``StageDeclarations``, typed and checked when the config is parsed).

- ``tasks = ("transcribe",)``: the stage transcribes (stages/voice/asr.py): the
  server serves /v1/audio/transcriptions and Realtime input audio transcription.
- ``voices = ("name", ...)``: the voices the stage speaks in, its default first. A
  pipeline whose stages declare none has one voice, ``default``.

OpenAI's voice names (alloy, marin, ...) are accepted too, as names of the default
voice, because the SDKs and the voice frameworks send one by default; /v1/audio/voices
lists them as such. Any other name is refused, naming the choices.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from .._config import PipelineConfig, resolve_impl
from .._stage import StageDeclarations

TRANSCRIBE_TASK = "transcribe"
"""The request option ``task`` of a transcription; a stage's ``tasks`` must name it."""
DEFAULT_VOICE = "default"
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "cedar",
    "coral",
    "echo",
    "fable",
    "marin",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)


@dataclass(frozen=True)
class Voices:
    """The pipeline's own voices (the default first) and the names that mean the default."""

    own: tuple[str, ...]
    aliases: tuple[str, ...]

    @property
    def default(self) -> str:
        return self.own[0]

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may give."""
        return self.own + self.aliases

    def check(self, voice: str) -> str | None:
        """None if ``voice`` is a name of this pipeline; else the reason to refuse it."""
        if voice in self.names:
            return None
        return (
            f"{voice[:64]!r} is not a voice of this server; choose one of: {', '.join(self.names)}"
        )

    def listing(self) -> list[dict[str, str]]:
        """``GET /v1/audio/voices``: each name, and the voice it speaks in."""
        return [{"id": name, "object": "voice", "speaks_as": name} for name in self.own] + [
            {"id": name, "object": "voice", "speaks_as": self.default} for name in self.aliases
        ]


def _stage_classes(config: PipelineConfig) -> list[tuple[str, object]]:
    return [(spec.name, resolve_impl(spec.impl, config.source, "impl")) for spec in config.stages]


def transcribing_stages(config: PipelineConfig) -> list[str]:
    """The stages whose class declares ``tasks`` with ``transcribe``."""
    return [
        name
        for name, impl in _stage_classes(config)
        if TRANSCRIBE_TASK in StageDeclarations.of(impl).tasks
    ]


def transcription_model(config: PipelineConfig) -> str | None:
    """The speech-recognition stage as sessions name it: its class (None: none)."""
    for _, impl in _stage_classes(config):
        if TRANSCRIBE_TASK in StageDeclarations.of(impl).tasks:
            return str(getattr(impl, "__name__", "asr"))
    return None


def transcription_language(config: PipelineConfig) -> str:
    """The language the speech-recognition stage transcribes: its ``language`` param,
    else the default of its constructor's ``language`` (``"en"`` when it has none)."""
    for spec in config.stages:
        impl = resolve_impl(spec.impl, config.source, "impl")
        if TRANSCRIBE_TASK in StageDeclarations.of(impl).tasks:
            if "language" in spec.params:
                return str(spec.params["language"])
            parameter = inspect.signature(impl).parameters.get("language")
            if parameter is not None and isinstance(parameter.default, str):
                return parameter.default
    return "en"


def pipeline_voices(config: PipelineConfig) -> Voices:
    """The voices the pipeline's stages declare, and OpenAI's names for the default."""
    own: list[str] = []
    for _, impl in _stage_classes(config):
        for voice in StageDeclarations.of(impl).voices:
            if str(voice) not in own:
                own.append(str(voice))
    if not own:
        own = [DEFAULT_VOICE]
    return Voices(tuple(own), tuple(v for v in OPENAI_VOICES if v not in own))
