"""session.update and response.create parameters, parsed in the session's dialect.

The GA and beta SDKs shape the session differently (GA nests audio settings
under ``audio.input`` / ``audio.output``; beta has flat ``modalities``,
``voice``, ``input_audio_format`` ...), so each dialect has its parser; both
produce a ``SettingsPatch``.

A session.update is read field by field (``Problems``): a field omnitrio cannot
honour gets its own ``error`` event naming it, and the others still apply, so one
unsupported knob does not drop a client's voice and format settings. A
response.create is refused whole (a response must not run with settings other than
the ones asked). Parameters the SDK knows but omnitrio cannot honour are refused
with ``unsupported_parameter`` unless their value asks for nothing (``include: []``).
``turn_detection`` (server_vad, semantic_vad) is honoured when the pipeline has a turn
detector (_turns.py); input audio transcription when it has a speech-recognition stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from ..tools import (
    TOOL_MODES,
    FunctionTool,
    ToolChoice,
    ToolError,
    ToolLimits,
    check_tools,
    empty_parameters,
)
from ._config import SessionConfig
from ._errors import ClientEventError, quote
from ._fields import Fields, Problems, check_text
from ._settings import MODALITIES, Modality, SettingsPatch, Transcription, TranscriptionPatch
from ._turns import TurnDetectionPatch, parse_turn_detection

MAX_METADATA_PAIRS = 16


def _never(value: object) -> bool:
    return False


def _empty_list(value: object) -> bool:
    return value == []


def _is_one(value: object) -> bool:
    return not isinstance(value, bool) and value == 1


# Parameters accepted only with a value that asks for nothing: (accepts, why not).
_IGNORABLE: Mapping[str, tuple[Callable[[object], bool], str]] = {
    "tracing": (lambda v: v == "auto", 'tracing is not available; send null (or "auto")'),
    "include": (_empty_list, "transcription logprobs are not available; send []"),
    "prompt": (_never, "prompt templates are not available; send instructions"),
    "reasoning": (_never, "reasoning settings are not available"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a response makes one call at most"),
    "truncation": (lambda v: v in ("auto", "disabled"), "omnitrio never truncates"),
    "speed": (_is_one, "the speech speed is fixed at 1.0"),
    "noise_reduction": (_never, "input noise reduction is not available; send null"),
    "input_audio_noise_reduction": (_never, "input noise reduction is not available"),
    "conversation": (lambda v: v == "auto", "out-of-band responses are not available"),
    "input": (_never, "a response always answers the whole conversation"),
}


def _ignorable(fields: Fields, *keys: str) -> None:
    for key in keys:
        accepts, why = _IGNORABLE[key]
        fields.unsupported_unless(key, accepts, why)


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


def _voice(fields: Fields, key: str, config: SessionConfig, *, allow_id: bool) -> str | None:
    value = fields.raw(key)
    if value is None:
        return None
    if isinstance(value, str):
        voice = check_text(value, fields.param(key))
    elif allow_id and isinstance(value, Mapping):
        named = Fields(value, fields.param(key))
        voice = named.required_str("id")
        named.done()
    else:
        raise ClientEventError(
            "invalid_type", f"{fields.param(key)} must be a voice name", param=fields.param(key)
        )
    if config.voices and voice not in config.voices:
        raise ClientEventError(
            "invalid_value",
            f"{fields.param(key)} {quote(voice)} is not a voice of this server; "
            f"choose one of: {', '.join(config.voices)}",
            param=fields.param(key),
        )
    return voice


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


def parse_session(
    fields: Fields, config: SessionConfig
) -> tuple[SettingsPatch, list[ClientEventError]]:
    """The ``session`` object of a session.update, in the session's dialect, and the
    per-field errors: a field that cannot be honoured is named in its own error event
    and left as it was, and the other fields still apply."""
    problems = Problems()
    if config.dialect == "beta":
        patch = _parse_beta_session(fields, config, problems)
    else:
        patch = _parse_ga_session(fields, config, problems)
    problems.done(fields)
    return patch, problems.errors


def _parse_ga_session(fields: Fields, config: SessionConfig, problems: Problems) -> SettingsPatch:
    kind = fields.optional_str("type")
    if kind == "transcription":
        raise ClientEventError(
            "unsupported_parameter",
            "session.type transcription is not supported; use realtime",
            param="session.type",
        )
    fields.choice("type", ("realtime",))
    fields.optional_str("model")  # the pipeline is fixed by the server; session.model shows it
    voice: str | None = None
    turn_detection: TurnDetectionPatch = None
    transcription: TranscriptionPatch = None
    audio = problems.read(lambda: fields.optional_object("audio"))
    if audio is not None:
        audio_in = problems.read(lambda: audio.optional_object("input"))
        if audio_in is not None:
            in_format = problems.read(lambda: audio_in.optional_object("format"))
            problems.read(lambda: _pcm_format(in_format, config.input_sample_rate_hz))
            turn_detection = problems.read(
                lambda: parse_turn_detection(audio_in, "turn_detection", config.server_vad)
            )
            transcription = problems.read(lambda: _transcription(audio_in, "transcription", config))
            problems.read(lambda: _ignorable(audio_in, "noise_reduction"))
            problems.done(audio_in)
        audio_out = problems.read(lambda: audio.optional_object("output"))
        if audio_out is not None:
            out_format = problems.read(lambda: audio_out.optional_object("format"))
            problems.read(lambda: _pcm_format(out_format, config.output_sample_rate_hz))
            voice = problems.read(lambda: _voice(audio_out, "voice", config, allow_id=True))
            problems.read(lambda: _ignorable(audio_out, "speed"))
            problems.done(audio_out)
        problems.done(audio)
    for key in ("tracing", "include", "prompt", "reasoning", "parallel_tool_calls", "truncation"):
        problems.read(lambda key=key: _ignorable(fields, key))  # type: ignore[misc]
    return SettingsPatch(
        output_modalities=problems.read(lambda: _modalities(fields, "output_modalities")),
        instructions=problems.read(lambda: fields.optional_str("instructions")),
        voice=voice,
        temperature=problems.read(lambda: _temperature(fields)),
        max_output_tokens=problems.read(
            lambda: _max_tokens(fields, "max_output_tokens", config.max_output_tokens)
        ),
        turn_detection=turn_detection,
        transcription=transcription,
        tools=problems.read(lambda: _tools(fields, config.tool_limits)),
        tool_choice=problems.read(lambda: _tool_choice(fields)),
    )


def _parse_beta_session(fields: Fields, config: SessionConfig, problems: Problems) -> SettingsPatch:
    fields.optional_str("model")
    problems.read(lambda: _beta_format(fields, "input_audio_format"))
    problems.read(lambda: _beta_format(fields, "output_audio_format"))
    for key in ("tracing", "speed", "input_audio_noise_reduction"):
        problems.read(lambda key=key: _ignorable(fields, key))  # type: ignore[misc]
    return SettingsPatch(
        output_modalities=problems.read(lambda: _modalities(fields, "modalities")),
        instructions=problems.read(lambda: fields.optional_str("instructions")),
        voice=problems.read(lambda: _voice(fields, "voice", config, allow_id=False)),
        temperature=problems.read(lambda: _temperature(fields)),
        max_output_tokens=problems.read(
            lambda: _max_tokens(fields, "max_response_output_tokens", config.max_output_tokens)
        ),
        turn_detection=problems.read(
            lambda: parse_turn_detection(fields, "turn_detection", config.server_vad)
        ),
        transcription=problems.read(
            lambda: _transcription(fields, "input_audio_transcription", config)
        ),
        tools=problems.read(lambda: _tools(fields, config.tool_limits)),
        tool_choice=problems.read(lambda: _tool_choice(fields)),
    )


def _transcription(fields: Fields, key: str, config: SessionConfig) -> TranscriptionPatch:
    """Input audio transcription: an object turns it on (the pipeline's speech-recognition
    stage transcribes, whatever ``model`` names), null turns it off."""
    if key not in fields.keys():  # noqa: SIM118 (Fields is not a mapping)
        return None
    value = fields.optional_object(key)
    if value is None:
        return "off"
    if config.transcription_model is None:
        raise ClientEventError(
            "unsupported_parameter",
            f"{fields.param(key)} is not supported: this pipeline has no speech-recognition "
            "stage; send null",
            param=fields.param(key),
        )
    value.optional_str("model")
    value.unsupported_unless(
        "language", _never, "the speech-recognition stage's language is set by the pipeline"
    )
    value.unsupported_unless("prompt", lambda v: v == "", "transcription prompts are not available")
    value.done()
    return Transcription(config.transcription_model)


def parse_response_params(fields: Fields, config: SessionConfig) -> SettingsPatch:
    """The ``response`` object of a response.create, in the session's dialect."""
    _ignorable(fields, "conversation", "input")
    tools, tool_choice = _tools(fields, config.tool_limits), _tool_choice(fields)
    if config.dialect == "beta":
        _beta_format(fields, "output_audio_format")
        return SettingsPatch(
            output_modalities=_modalities(fields, "modalities"),
            instructions=fields.optional_str("instructions"),
            voice=_voice(fields, "voice", config, allow_id=False),
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
            voice = _voice(audio_out, "voice", config, allow_id=True)
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
