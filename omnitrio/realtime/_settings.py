"""Session settings: what session.update / response.create change, and what is in force.

``SettingsPatch`` is one update (parsed by _parse_settings.py, in either dialect);
``Settings`` is what a session, or one response, runs with. Function tools meet
omnitrio's one set of rules (omnitrio/tools.py). ``tool_choice`` is checked against
the tools when a response is created, not when it is set: a client may send
``tool_choice: "required"`` before its tools (Pipecat does), and only a response
that would still have no tools is refused, naming both fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .._items import JsonValue
from .._options import ResponseOptions
from ..tools import FunctionTool, ToolChoice, ToolError, check_tool_choice, with_tools
from ._config import SessionConfig
from ._errors import ClientEventError
from ._turns import TurnDetection, TurnDetectionPatch

Modality = Literal["text", "audio"]
MODALITIES: tuple[Modality, ...] = ("text", "audio")


@dataclass(frozen=True)
class Transcription:
    """Input audio transcription is on: the pipeline's speech-recognition stage
    transcribes each committed turn (``model`` is that stage's, whatever the client named)."""

    model: str

    def render(self) -> dict[str, JsonValue]:
        return {"model": self.model, "language": None, "prompt": None}


TranscriptionPatch = Transcription | Literal["off"] | None
"""What an update asks: transcription on, "off" (null), or no change."""


@dataclass(frozen=True)
class SettingsPatch:
    """What one session.update or response.create changes; ``None`` leaves a setting."""

    output_modalities: tuple[Modality, ...] | None = None
    instructions: str | None = None
    voice: str | None = None
    temperature: float | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    turn_detection: TurnDetectionPatch = None
    transcription: TranscriptionPatch = None
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: ToolChoice | None = None


@dataclass(frozen=True)
class Settings:
    """The effective settings of a session, or of one response."""

    output_modalities: tuple[Modality, ...]
    instructions: str = ""
    voice: str | None = None  # None: the pipeline's default voice
    temperature: float | None = None  # None: the pipeline's default
    max_output_tokens: int | None = None  # None: no limit ("inf" on the wire)
    turn_detection: TurnDetection | None = None  # None: the client commits
    transcription: Transcription | None = None  # None: no transcription events
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)

    def apply(self, patch: SettingsPatch) -> Settings:
        """These settings changed by ``patch``."""
        limit = patch.max_output_tokens
        return Settings(
            tools=self.tools if patch.tools is None else patch.tools,
            tool_choice=self.tool_choice if patch.tool_choice is None else patch.tool_choice,
            output_modalities=patch.output_modalities or self.output_modalities,
            instructions=self.instructions if patch.instructions is None else patch.instructions,
            voice=patch.voice or self.voice,
            temperature=self.temperature if patch.temperature is None else patch.temperature,
            max_output_tokens=(
                self.max_output_tokens if limit is None else None if limit == "inf" else limit
            ),
            turn_detection=(
                self.turn_detection
                if patch.turn_detection is None
                else None
                if patch.turn_detection == "off"
                else patch.turn_detection
            ),
            transcription=(
                self.transcription
                if patch.transcription is None
                else None
                if patch.transcription == "off"
                else patch.transcription
            ),
        )

    def check_tool_choice(self) -> None:
        """``ClientEventError`` if a response with these settings cannot meet its
        tool_choice (a required call with no tools, a named function not among them)."""
        try:
            check_tool_choice(self.tools, self.tool_choice)
        except ToolError as exc:
            raise ClientEventError(
                "invalid_value",
                f"{exc}: send tools (session.update or response.create) or another tool_choice",
                param="tool_choice",
            ) from None

    def options(self) -> ResponseOptions:
        """The response's options, as stages read them from ``Request.options``."""
        options = ResponseOptions(
            modalities=self.output_modalities,
            instructions=self.instructions or None,
            voice=self.voice,
            temperature=self.temperature,
            max_tokens=self.max_output_tokens,
        )
        return with_tools(options, self.tools, self.tool_choice)

    def tools_shape(self) -> tuple[JsonValue, ...]:
        """The tools as session objects show them."""
        return tuple({"type": "function", **t.described()} for t in self.tools)

    def tool_choice_shape(self) -> JsonValue:
        if self.tool_choice.name is not None:
            return {"type": "function", "name": self.tool_choice.name}
        return self.tool_choice.mode


def default_settings(config: SessionConfig) -> Settings:
    # The SDKs' own defaults: GA answers in audio (with a transcript); beta in both.
    # server_vad when the pipeline can detect turns, as OpenAI's own default; input
    # transcription on when the pipeline transcribes (the turn's text is there anyway).
    model = config.transcription_model
    return Settings(
        output_modalities=("audio",) if config.dialect == "ga" else MODALITIES,
        turn_detection=TurnDetection() if config.server_vad else None,
        transcription=None if model is None else Transcription(model),
    )
