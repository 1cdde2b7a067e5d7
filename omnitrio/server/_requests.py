"""The HTTP API's request bodies, typed: the one place a request is validated.

Each endpoint's body is a pydantic model here (chat completions, speech, the
transcription form); ``parse_json`` and ``parse_form`` turn a bad body into a
``BadRequest`` naming the field (``messages.0.role``), which the endpoint answers
as a 400 in OpenAI's error shape. Field checks (ranges, caps) belong on these
models, so that every endpoint gets them the same way.

Nothing is accepted and ignored (the same policy as the Realtime API's; see
docs/protocol.md): a field no model here declares is refused as an
``unknown_parameter``, and a field of OpenAI's API that omnitrio cannot honour is
declared in ``UNSUPPORTED`` and refused as an ``unsupported_parameter`` unless its
value asks for nothing (``n: 1``, ``stop: null``, ``store: false``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

import pydantic

from ._settings import ServerSettings
from ._speech_formats import SpeechFormat
from ._tools import ChatTool, ChatToolChoice, ToolCall

SEED_RANGE = (-(2**63), 2**64 - 1)
"""A sampling seed: what a torch generator takes (a 64-bit integer, either sign)."""


class BadRequest(ValueError):
    """A request the server refuses; ``param`` names the field, ``code`` is OpenAI's."""

    def __init__(
        self, message: str, param: str | None, code: str = "invalid_request", status: int = 400
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status

    def __reduce__(self) -> tuple[type[BadRequest], tuple[str, str | None, str, int]]:
        # Raised in a checking process too: it pickles by its fields.
        return (BadRequest, (str(self), self.param, self.code, self.status))


def _none(value: object) -> bool:
    return value is None


def _none_or(*allowed: object) -> Callable[[object], bool]:
    return lambda value: value is None or any(value == a for a in allowed)


Rule = tuple[Callable[[object], bool], str]
"""(the values that ask for nothing, why any other value is refused)."""


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    UNSUPPORTED: ClassVar[Mapping[str, Rule]] = {}

    def refused_field(self, path: str = "") -> BadRequest | None:
        """The first field set to a value omnitrio cannot honour (None: none is)."""
        for name, (accepts, why) in self.UNSUPPORTED.items():
            if not accepts(getattr(self, name)):
                where = f"{path}{name}"
                return BadRequest(
                    f"{where} is not supported: {why}", where, "unsupported_parameter"
                )
        return None


_NO_CACHE = "omnitrio keeps no prompt cache; send null"
_NO_ID = "omnitrio keeps no per-user records; send null"


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: object = None
    refusal: object = None
    audio: object = None
    function_call: object = None

    UNSUPPORTED: ClassVar[Mapping[str, Rule]] = {
        "name": (_none, "participant names are not available; send null"),
        "refusal": (_none, "an assistant message's refusal cannot be replayed; send null"),
        "audio": (_none, "an earlier answer's audio cannot be referred to; send its transcript"),
        "function_call": (_none, "deprecated; send tool_calls"),
    }


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: object = None

    UNSUPPORTED: ClassVar[Mapping[str, Rule]] = {
        "include_obfuscation": (_none_or(False), "streams are not obfuscated; send false"),
    }


ChatAudioFormat = Literal["pcm16", "wav", "mp3", "opus", "aac", "flac"]
"""Chat audio formats: the speech endpoint's, encoded alike (``pcm16`` is its ``pcm``)."""


class AudioParams(_Strict):
    voice: str = "default"
    format: ChatAudioFormat = "pcm16"


class ChatRequest(_Strict):
    model: str
    messages: list[Message] = pydantic.Field(min_length=1)
    modalities: list[Literal["text", "audio"]] = ["text"]
    audio: AudioParams | None = None
    stream: bool = False
    max_tokens: int | None = pydantic.Field(default=None, ge=1)
    max_completion_tokens: int | None = pydantic.Field(default=None, ge=1)
    temperature: float | None = pydantic.Field(default=None, ge=0, le=2)
    top_p: float | None = pydantic.Field(default=None, gt=0, le=1)
    seed: int | None = pydantic.Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    tools: list[ChatTool] | None = None
    tool_choice: ChatToolChoice | None = None
    stream_options: StreamOptions | None = None
    n: int | None = pydantic.Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None  # one call at most meets either value
    frequency_penalty: object = None
    presence_penalty: object = None
    functions: object = None
    function_call: object = None
    logit_bias: object = None
    logprobs: object = None
    top_logprobs: object = None
    metadata: object = None
    moderation: object = None
    prediction: object = None
    prompt_cache_key: object = None
    prompt_cache_options: object = None
    prompt_cache_retention: object = None
    reasoning_effort: object = None
    response_format: object = None
    safety_identifier: object = None
    service_tier: object = None
    stop: object = None
    store: object = None
    user: object = None
    verbosity: object = None
    web_search_options: object = None

    UNSUPPORTED: ClassVar[Mapping[str, Rule]] = {
        "n": (_none_or(1), "one choice is generated per request; send 1"),
        "frequency_penalty": (_none_or(0), "sampling penalties are not available; send 0"),
        "presence_penalty": (_none_or(0), "sampling penalties are not available; send 0"),
        "functions": (_none, "deprecated; send tools"),
        "function_call": (_none, "deprecated; send tool_choice"),
        "logit_bias": (_none_or({}), "logit biases are not available"),
        "logprobs": (_none_or(False), "log probabilities are not available; send false"),
        "top_logprobs": (_none_or(0), "log probabilities are not available"),
        "metadata": (_none, "stored completions are not available; send null"),
        "moderation": (_none, "moderation is not available; send null"),
        "prediction": (_none, "predicted outputs are not available; send null"),
        "prompt_cache_key": (_none, _NO_CACHE),
        "prompt_cache_options": (_none, _NO_CACHE),
        "prompt_cache_retention": (_none, _NO_CACHE),
        "reasoning_effort": (_none, "the pipeline's models do not reason; send null"),
        "response_format": (
            _none_or({"type": "text"}),
            'structured outputs are not available; send {"type": "text"} or use tools',
        ),
        "safety_identifier": (_none, _NO_ID),
        "service_tier": (_none_or("auto", "default"), 'one tier; send "auto"'),
        "stop": (_none_or([]), "stop sequences are not available; send null"),
        "store": (_none_or(False), "stored completions are not available; send false"),
        "user": (_none, _NO_ID),
        "verbosity": (_none, "verbosity is not available; send null"),
        "web_search_options": (_none, "web search is not available; send null"),
    }

    def refused_field(self, path: str = "") -> BadRequest | None:
        nested: list[tuple[str, _Strict | None]] = [
            (f"messages.{i}.", m) for i, m in enumerate(self.messages)
        ]
        nested.append(("stream_options.", self.stream_options))
        for where, part in nested:
            found = part.refused_field(where) if part is not None else None
            if found is not None:
                return found
        return super().refused_field(path)


def check_chat(chat: ChatRequest, settings: ServerSettings) -> None:
    """The checks that depend on the server's settings: ``max_tokens`` and
    ``max_completion_tokens`` at most ``settings.max_output_tokens`` (reported)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(chat, name)
        if value is not None and value > settings.max_output_tokens:
            raise BadRequest(
                f"{name}: {value:.3g} is above this server's cap of "
                f"{settings.max_output_tokens} tokens (max_output_tokens)",
                name,
                "invalid_value",
            )


SPEEDS = (1.0,)
"""The speech speeds the TTS stages speak at (the Realtime API refuses others alike)."""


class SpeechRequest(_Strict):
    model: str
    input: str = pydantic.Field(min_length=1, max_length=4096)
    voice: str = "default"
    response_format: SpeechFormat = "mp3"
    speed: float = pydantic.Field(default=1.0, ge=0.25, le=4.0)
    instructions: object = None
    stream_format: object = None

    UNSUPPORTED: ClassVar[Mapping[str, Rule]] = {
        "speed": (lambda v: v in SPEEDS, "the speech speed is fixed at 1.0"),
        "instructions": (_none_or(""), "voice instructions are not available; send null"),
        "stream_format": (_none_or("audio"), 'speech streams as audio bytes; send "audio"'),
    }


class TranscriptionForm(_Strict):
    """The form fields of ``POST /v1/audio/transcriptions`` (the upload is ``file``)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: Literal["json", "text", "verbose_json"] = "json"
    temperature: float | None = pydantic.Field(default=None, ge=0, le=1)
    timestamp_granularities: list[Literal["segment", "word"]] | None = None
    stream: bool | None = None
    include: object = None
    chunking_strategy: object = None
    keywords: object = None
    languages: object = None
    known_speaker_names: object = None
    known_speaker_references: object = None

    UNSUPPORTED: ClassVar[Mapping[str, Rule]] = {
        "prompt": (_none_or(""), "transcription prompts are not available"),
        "temperature": (_none_or(0), "the speech-recognition stage decodes greedily; send 0"),
        "timestamp_granularities": (
            _none_or(["segment"]),
            'only segment timestamps are available (with response_format "verbose_json")',
        ),
        "stream": (_none_or(False), "transcriptions are not streamed; send false"),
        "include": (_none_or([]), "log probabilities are not available"),
        "chunking_strategy": (_none_or("auto"), 'the whole file is transcribed; send "auto"'),
        "keywords": (_none_or([]), "keyword boosting is not available"),
        "languages": (_none_or([]), "send one language in language"),
        "known_speaker_names": (_none_or([]), "speaker diarization is not available"),
        "known_speaker_references": (_none_or([]), "speaker diarization is not available"),
    }


Body = TypeVar("Body", bound=_Strict)


def _bad(exc: pydantic.ValidationError) -> BadRequest:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    if first["type"] == "extra_forbidden":
        message = f"unknown parameter {where!r}; docs/protocol.md lists the supported ones"
        return BadRequest(message, where, "unknown_parameter")
    return BadRequest(f"{where}: {first['msg']}", where)


def _checked(body: Body) -> Body:
    refused = body.refused_field()
    if refused is not None:
        raise refused
    return body


def parse_json(model: type[Body], raw: bytes) -> Body:
    """The JSON body ``raw`` as ``model``; ``BadRequest`` naming the first bad field."""
    try:
        return _checked(model.model_validate_json(raw))
    except pydantic.ValidationError as exc:
        raise _bad(exc) from None


def parse_form(model: type[Body], fields: Mapping[str, object]) -> Body:
    """Form ``fields`` (one value a name; a list for ``name[]``) as ``model``."""
    try:
        return _checked(model.model_validate(dict(fields)))
    except pydantic.ValidationError as exc:
        raise _bad(exc) from None
