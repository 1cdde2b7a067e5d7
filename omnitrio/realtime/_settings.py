"""Session settings: parsed from session.update / response.create, shown in session.*.

The GA and beta SDKs shape the session differently (GA nests audio settings
under ``audio.input`` / ``audio.output``; beta has flat ``modalities``,
``voice``, ``input_audio_format`` ...), so each dialect has its parser and its
rendering. Both produce and read the same ``Settings``.

Function tools (``tools``, ``tool_choice``) meet omnitrio's one set of rules
(omnitrio/_tools.py: the name pattern, no two alike, a schema the tool-call grammar
compiles), checked here before a response opens a stream, and reach the LLM stage
as request options (see stages/voice/llm.py). Parameters the SDK knows but omnitrio cannot honour
(transcription, other audio formats) are refused with ``unsupported_parameter``
unless their value asks for nothing (``include: []``). ``turn_detection`` (server VAD) is
honoured when the pipeline has a turn detector (see _turns.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .._items import JsonValue, Scalar
from ..tools import (
    TOOL_MODES,
    FunctionTool,
    ToolChoice,
    ToolError,
    ToolLimits,
    check_tool_choice,
    check_tools,
    empty_parameters,
    tool_options,
)
from ._config import SessionConfig
from ._errors import ClientEventError, quote
from ._fields import Fields, check_text
from ._turns import TurnDetection, TurnDetectionPatch, parse_turn_detection

Modality = Literal["text", "audio"]
MODALITIES: tuple[Modality, ...] = ("text", "audio")
MAX_METADATA_PAIRS = 16


def _never(value: object) -> bool:
    return False


def _empty_list(value: object) -> bool:
    return value == []


def _is_one(value: object) -> bool:
    return not isinstance(value, bool) and value == 1


# Parameters accepted only with a value that asks for nothing: (accepts, why not).
_IGNORABLE: Mapping[str, tuple[Callable[[object], bool], str]] = {
    "tracing": (_never, "tracing is not available; send null"),
    "include": (_empty_list, "transcription logprobs are not available; send []"),
    "prompt": (_never, "prompt templates are not available; send instructions"),
    "reasoning": (_never, "reasoning settings are not available"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a response makes one call at most"),
    "truncation": (lambda v: v in ("auto", "disabled"), "omnitrio never truncates"),
    "speed": (_is_one, "the speech speed is fixed at 1.0"),
    "noise_reduction": (_never, "input noise reduction is not available; send null"),
    "transcription": (_never, "input audio transcription is not available; send null"),
    "input_audio_transcription": (_never, "input audio transcription is not available"),
    "input_audio_noise_reduction": (_never, "input noise reduction is not available"),
    "conversation": (lambda v: v == "auto", "out-of-band responses are not available"),
    "input": (_never, "a response always answers the whole conversation"),
}


def _ignorable(fields: Fields, *keys: str) -> None:
    for key in keys:
        accepts, why = _IGNORABLE[key]
        fields.unsupported_unless(key, accepts, why)


@dataclass(frozen=True)
class SettingsPatch:
    """What one session.update or response.create changes; ``None`` leaves a setting."""

    output_modalities: tuple[Modality, ...] | None = None
    instructions: str | None = None
    voice: str | None = None
    temperature: float | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    turn_detection: TurnDetectionPatch = None
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
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)

    def apply(self, patch: SettingsPatch) -> Settings:
        """These settings changed by ``patch``; ``ClientEventError`` if the result asks
        for a function that is not among the tools."""
        limit = patch.max_output_tokens
        tools = self.tools if patch.tools is None else patch.tools
        choice = self.tool_choice if patch.tool_choice is None else patch.tool_choice
        try:
            check_tool_choice(tools, choice)
        except ToolError as exc:
            raise ClientEventError("invalid_value", str(exc), param="tool_choice") from None
        return Settings(
            tools=tools,
            tool_choice=choice,
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
        )

    def options(self) -> dict[str, Scalar]:
        """The per-response knobs a stage reads from ``Request.options`` (set ones only)."""
        options: dict[str, Scalar] = {"output_modalities": ",".join(self.output_modalities)}
        if self.instructions:
            options["instructions"] = self.instructions
        if self.voice is not None:
            options["voice"] = self.voice
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.max_output_tokens is not None:
            options["max_tokens"] = self.max_output_tokens
        options.update(tool_options(self.tools, self.tool_choice))
        return options

    def tools_shape(self) -> tuple[JsonValue, ...]:
        """The tools as session objects show them."""
        return tuple({"type": "function", **t.described()} for t in self.tools)

    def tool_choice_shape(self) -> JsonValue:
        if self.tool_choice.name is not None:
            return {"type": "function", "name": self.tool_choice.name}
        return self.tool_choice.mode


def default_settings(config: SessionConfig) -> Settings:
    # The SDKs' own defaults: GA answers in audio (with a transcript); beta in both.
    # server_vad when the pipeline can detect turns, as OpenAI's own default.
    return Settings(
        output_modalities=("audio",) if config.dialect == "ga" else MODALITIES,
        turn_detection=TurnDetection() if config.server_vad else None,
    )


def _modalities(fields: Fields, key: str) -> tuple[Modality, ...] | None:
    values = fields.optional_array(key)
    if values is None:
        return None
    chosen = tuple(m for m in MODALITIES if m in values)
    if not values or len(chosen) != len(values):
        raise ClientEventError(
            "invalid_value",
            f'{fields.param(key)} must be ["text"], ["audio"] or ["text", "audio"]',
            param=fields.param(key),
        )
    return chosen


def _max_tokens(fields: Fields, key: str, cap: int) -> int | Literal["inf"] | None:
    """A response's token limit: 1 to ``cap`` (the server's ``max_output_tokens``) or
    ``"inf"`` (the pipeline's own limit)."""
    value = fields.raw(key)
    if value is None or value == "inf":
        return None if value is None else "inf"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
        raise ClientEventError(
            "invalid_value",
            f'{fields.param(key)} must be an integer from 1 to {cap} (this server\'s cap) or "inf"',
            param=fields.param(key),
        )
    return value


def _temperature(fields: Fields) -> float | None:
    value = fields.optional_number("temperature")
    if value is not None and value < 0:
        raise ClientEventError(
            "invalid_value",
            f"{fields.param('temperature')} must be >= 0",
            param=fields.param("temperature"),
        )
    return value


def _voice(fields: Fields, key: str, *, allow_id: bool) -> str | None:
    value = fields.raw(key)
    if value is None or isinstance(value, str):
        return value if value is None else check_text(value, fields.param(key))
    if allow_id and isinstance(value, Mapping):
        voice = Fields(value, fields.param(key))
        voice_id = voice.required_str("id")
        voice.done()
        return voice_id
    raise ClientEventError(
        "invalid_type", f"{fields.param(key)} must be a voice name", param=fields.param(key)
    )


def _pcm_format(fields: Fields | None, rate_hz: int) -> None:
    """A GA audio format object: only ``{"type": "audio/pcm", "rate": rate_hz}``."""
    if fields is None:
        return
    kind, rate = fields.optional_str("type"), fields.raw("rate")
    if kind not in (None, "audio/pcm") or (rate is not None and rate != rate_hz):
        where = fields.param("type") if kind not in (None, "audio/pcm") else fields.param("rate")
        raise ClientEventError(
            "unsupported_parameter",
            f'{where}: the only supported format is {{"type": "audio/pcm", "rate": {rate_hz}}} '
            "(PCM16 mono little-endian)",
            param=where,
        )
    fields.done()


def _beta_format(fields: Fields, key: str) -> None:
    value = fields.optional_str(key)
    if value is not None and value != "pcm16":
        raise ClientEventError(
            "unsupported_parameter",
            f"{fields.param(key)} {quote(value)} is not supported; the only format is pcm16",
            param=fields.param(key),
        )


def parse_session(fields: Fields, config: SessionConfig) -> SettingsPatch:
    """The ``session`` object of a session.update, in the session's dialect."""
    if config.dialect == "beta":
        return _parse_beta_session(fields, config)
    kind = fields.optional_str("type")
    if kind == "transcription":
        raise ClientEventError(
            "unsupported_parameter",
            "session.type transcription is not supported; use realtime",
            param="session.type",
        )
    fields.choice("type", ("realtime",))
    fields.optional_str("model")  # the pipeline is fixed by the server; the name is ignored
    voice = None
    turn_detection: TurnDetectionPatch = None
    audio = fields.optional_object("audio")
    if audio is not None:
        audio_in = audio.optional_object("input")
        if audio_in is not None:
            _pcm_format(audio_in.optional_object("format"), config.input_sample_rate_hz)
            turn_detection = parse_turn_detection(audio_in, "turn_detection", config.server_vad)
            _ignorable(audio_in, "noise_reduction", "transcription")
            audio_in.done()
        audio_out = audio.optional_object("output")
        if audio_out is not None:
            _pcm_format(audio_out.optional_object("format"), config.output_sample_rate_hz)
            voice = _voice(audio_out, "voice", allow_id=True)
            _ignorable(audio_out, "speed")
            audio_out.done()
        audio.done()
    patch = SettingsPatch(
        output_modalities=_modalities(fields, "output_modalities"),
        instructions=fields.optional_str("instructions"),
        voice=voice,
        temperature=_temperature(fields),
        max_output_tokens=_max_tokens(fields, "max_output_tokens", config.max_output_tokens),
        turn_detection=turn_detection,
        tools=_tools(fields, config.tool_limits),
        tool_choice=_tool_choice(fields),
    )
    _ignorable(fields, "tracing", "include", "prompt", "reasoning")
    _ignorable(fields, "parallel_tool_calls", "truncation")
    return patch


def _parse_beta_session(fields: Fields, config: SessionConfig) -> SettingsPatch:
    fields.optional_str("model")
    _beta_format(fields, "input_audio_format")
    _beta_format(fields, "output_audio_format")
    turn_detection = parse_turn_detection(fields, "turn_detection", config.server_vad)
    _ignorable(fields, "tracing", "speed")
    _ignorable(fields, "input_audio_transcription", "input_audio_noise_reduction")
    return SettingsPatch(
        output_modalities=_modalities(fields, "modalities"),
        instructions=fields.optional_str("instructions"),
        voice=_voice(fields, "voice", allow_id=False),
        temperature=_temperature(fields),
        max_output_tokens=_max_tokens(
            fields, "max_response_output_tokens", config.max_output_tokens
        ),
        turn_detection=turn_detection,
        tools=_tools(fields, config.tool_limits),
        tool_choice=_tool_choice(fields),
    )


def parse_response_params(fields: Fields, config: SessionConfig) -> SettingsPatch:
    """The ``response`` object of a response.create, in the session's dialect."""
    _ignorable(fields, "conversation", "input")
    tools, tool_choice = _tools(fields, config.tool_limits), _tool_choice(fields)
    if config.dialect == "beta":
        _beta_format(fields, "output_audio_format")
        return SettingsPatch(
            output_modalities=_modalities(fields, "modalities"),
            instructions=fields.optional_str("instructions"),
            voice=_voice(fields, "voice", allow_id=False),
            temperature=_temperature(fields),
            max_output_tokens=_max_tokens(
                fields, "max_response_output_tokens", config.max_output_tokens
            ),
            tools=tools,
            tool_choice=tool_choice,
        )
    _ignorable(fields, "prompt", "reasoning", "parallel_tool_calls")
    voice = None
    audio = fields.optional_object("audio")
    if audio is not None:
        audio_out = audio.optional_object("output")
        if audio_out is not None:
            _pcm_format(audio_out.optional_object("format"), config.output_sample_rate_hz)
            voice = _voice(audio_out, "voice", allow_id=True)
            audio_out.done()
        audio.done()
    return SettingsPatch(
        output_modalities=_modalities(fields, "output_modalities"),
        instructions=fields.optional_str("instructions"),
        voice=voice,
        temperature=_temperature(fields),
        max_output_tokens=_max_tokens(fields, "max_output_tokens", config.max_output_tokens),
        tools=tools,
        tool_choice=tool_choice,
    )


def _tools(fields: Fields, limits: ToolLimits) -> tuple[FunctionTool, ...] | None:
    """``tools``: function tools, each with a JSON-schema object as ``parameters``."""
    listed = fields.optional_array("tools")
    if listed is None:
        return None
    tools = []
    for index, value in enumerate(listed):
        tool = Fields(value, f"{fields.param('tools')}[{index}]")
        tool.choice("type", ("function",))
        name = tool.required_str("name")
        description = tool.optional_str("description") or ""
        parameters = tool.raw("parameters")
        if parameters is None:
            parameters = empty_parameters()
        if not isinstance(parameters, dict):
            raise ClientEventError(
                "invalid_type",
                f"{tool.param('parameters')} must be a JSON schema object",
                param=tool.param("parameters"),
            )
        tool.done()
        tools.append(FunctionTool(name, description, parameters))
    try:
        check_tools(tools, limits)
    except ToolError as exc:
        param = f"{fields.param('tools')}[{exc.index}].{exc.field}"
        raise ClientEventError("invalid_value", str(exc), param=param) from None
    return tuple(tools)


def _tool_choice(fields: Fields) -> ToolChoice | None:
    """``tool_choice``: auto, none, required, or ``{"type": "function", "name": ...}``."""
    raw = fields.raw("tool_choice")
    if raw is None:
        return None
    if isinstance(raw, str):
        mode = fields.choice("tool_choice", TOOL_MODES)
        assert mode is not None
        return ToolChoice(mode)  # type: ignore[arg-type]
    named = Fields(raw, fields.param("tool_choice"))
    named.choice("type", ("function",))
    name = named.required_str("name")
    named.done()
    return ToolChoice("required", name)


def parse_metadata(fields: Fields) -> tuple[tuple[str, str], ...]:
    """``metadata``: up to 16 string pairs, echoed in the response object."""
    metadata = fields.optional_object("metadata")
    if metadata is None:
        return ()
    pairs = tuple(
        (check_text(key, "response.metadata"), metadata.required_str(key))
        for key in metadata.keys()  # noqa: SIM118 (Fields is not a mapping)
    )
    if len(pairs) > MAX_METADATA_PAIRS:
        raise ClientEventError(
            "invalid_value",
            f"response.metadata has {len(pairs)} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            param="response.metadata",
        )
    return pairs
