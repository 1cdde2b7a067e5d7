"""The HTTP API's request bodies, typed: the one place a request is validated.

Each endpoint's body is a pydantic model here (chat completions, speech, the
transcription form); ``parse_json`` and ``parse_form`` turn a bad body into a
``BadRequest`` naming the field (``messages.0.role``), which the endpoint answers
as a 400 in OpenAI's error shape. Field checks (ranges, caps) belong on these
models, so that every endpoint gets them the same way.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import pydantic

from ._settings import ServerSettings
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


class _Lenient(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Lenient):
    include_usage: bool = False


class AudioParams(_Lenient):
    voice: str = "default"
    format: Literal["pcm16", "wav"] = "pcm16"


class ChatRequest(_Lenient):
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


class SpeechRequest(_Lenient):
    model: str
    input: str = pydantic.Field(min_length=1, max_length=4096)
    voice: str = "default"
    response_format: Literal["pcm", "wav"] = "pcm"


class TranscriptionForm(_Lenient):
    """The form fields of ``POST /v1/audio/transcriptions`` (the upload is ``file``)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: Literal["json", "text", "verbose_json"] = "json"
    temperature: float | None = None


Body = TypeVar("Body", bound=pydantic.BaseModel)


def _bad(exc: pydantic.ValidationError) -> BadRequest:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return BadRequest(f"{where}: {first['msg']}", where)


def parse_json(model: type[Body], raw: bytes) -> Body:
    """The JSON body ``raw`` as ``model``; ``BadRequest`` naming the first bad field."""
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise _bad(exc) from None


def parse_form(model: type[Body], fields: dict[str, object]) -> Body:
    """Form ``fields`` (one value a name; lists for ``name[]``) as ``model``."""
    try:
        return model.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise _bad(exc) from None
