"""Server VAD turn detection: settings, and the audio the server must listen to.

With ``turn_detection: {"type": "server_vad"}`` (or ``semantic_vad``, served by the
same detector with its ``eagerness`` as the silence time) the session hands every appended
chunk to the server as ``SideStageAudio``; the server runs it through the
pipeline's turn detector (a VAD stage) and reports back with
``RealtimeSession.speech_started`` / ``speech_stopped``. The session then sends
input_audio_buffer.speech_started / speech_stopped, commits the buffer at the
end of speech and, with ``create_response``, starts the response itself.
Speech that starts while a response is active cancels it (``interrupt_response``):
barge-in.

Detection restarts (a new ``generation``) whenever the client changes
turn_detection, so reports about audio from before the change are ignored.
Times (``audio_start_ms``, ``audio_end_ms``) count from the generation's first
sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .._items import JsonValue, Scalar
from ._errors import ClientEventError
from ._fields import Fields

VAD_WHY = (
    "this server's pipeline has no turn detector (server VAD); send null, commit the input "
    "audio and send response.create"
)
DEFAULT_PREFIX_PADDING_MS = 300
DEFAULT_SILENCE_DURATION_MS = 500
DEFAULT_THRESHOLD = 0.5
END_PADDING_MS = 64
"""Audio a server_vad turn keeps after its last speech (``audio_end_ms``); what came
later stays in the buffer. A fixed cut makes the turn's audio the same whether it is
taken at the first pause (a speculative response, see ``RealtimeSession.speculate``)
or when the silence is long enough to end the turn. 64 ms is two of the voice chat's
32 ms VAD windows: its pause (``pause_ms`` 64) is heard when that audio has arrived, so
the speculation can be built at once (with 100 ms and a 64 ms pause one in five could
not; docs/benchmarks-voice.md). Silero places the end of speech 0-80 ms after the last
sound, so the turn still keeps 64-150 ms of the silence that follows."""
EAGERNESS_SILENCE_MS: Mapping[str, int] = {"low": 1000, "medium": 500, "auto": 500, "high": 250}
"""semantic_vad's ``eagerness`` as the silence that ends a turn, with a longer wait for
"low" (the speaker may take their time) and a shorter one for "high". The eagerness
also goes to the turn detector's stream: a detector with a semantic end-of-turn model
(the voice chat's VAD with Smart Turn, ``stages/voice/vad.py``) then decides at that
silence whether the speech sounds finished, and waits longer when it does not.
session.updated shows the server_vad settings in force, which is what the client's
semantic_vad became."""
IDLE_KEEP_MS = 10_000
"""Audio kept while no one speaks, beyond the prefix padding; older audio is dropped
(the detector reports a start only after hearing it, so this is its allowance for
lagging behind a client that sends audio faster than real time)."""


@dataclass(frozen=True)
class TurnDetection:
    """The session's server_vad settings (the OpenAI defaults unless the client sets them)."""

    threshold: float = DEFAULT_THRESHOLD
    prefix_padding_ms: int = DEFAULT_PREFIX_PADDING_MS
    silence_duration_ms: int = DEFAULT_SILENCE_DURATION_MS
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str | None = None
    """Set when the client asked for semantic_vad: the eagerness that chose the times."""

    def options(self) -> Mapping[str, Scalar]:
        """Request options for the turn detector's stream (``eagerness`` only for
        semantic_vad)."""
        options: dict[str, Scalar] = {
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
        }
        if self.eagerness is not None:
            options["eagerness"] = self.eagerness
        return options

    def render(self) -> dict[str, JsonValue]:
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": None,
        }


TurnDetectionPatch = TurnDetection | Literal["off"] | None
"""What an update asks: server_vad with these settings, "off" (null), or no change."""


@dataclass(frozen=True)
class SideStageAudio:
    """The server must hand ``pcm16`` to its turn detector, in a detector stream for
    ``generation`` (opened with ``options``; a new generation replaces the old stream)."""

    pcm16: bytes
    generation: int
    options: Mapping[str, Scalar]


def parse_turn_detection(fields: Fields, key: str, available: bool) -> TurnDetectionPatch:
    if key not in fields.keys():  # noqa: SIM118 (Fields is not a mapping)
        return None
    value = fields.optional_object(key)
    if value is None:
        return "off"
    if not available:
        raise ClientEventError(
            "unsupported_parameter",
            f"{fields.param(key)} is not supported: {VAD_WHY}",
            param=fields.param(key),
        )
    kind = value.choice("type", ("server_vad", "semantic_vad")) or "server_vad"
    if kind == "semantic_vad":
        return _semantic(value)
    threshold = value.optional_number("threshold")
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ClientEventError(
            "invalid_value",
            f"{value.param('threshold')} must be between 0 and 1",
            param=value.param("threshold"),
        )
    detection = TurnDetection(
        threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
        prefix_padding_ms=_milliseconds(value, "prefix_padding_ms", DEFAULT_PREFIX_PADDING_MS),
        silence_duration_ms=_milliseconds(
            value, "silence_duration_ms", DEFAULT_SILENCE_DURATION_MS
        ),
        create_response=_flag(value, "create_response"),
        interrupt_response=_flag(value, "interrupt_response"),
    )
    value.unsupported_unless("idle_timeout_ms", lambda v: False, "idle timeouts are not available")
    value.done()
    return detection


def _semantic(value: Fields) -> TurnDetection:
    """semantic_vad: the turn ends after the silence its ``eagerness`` maps to
    (``EAGERNESS_SILENCE_MS``); the detector's other settings are the defaults."""
    eagerness = value.choice("eagerness", tuple(EAGERNESS_SILENCE_MS)) or "auto"
    detection = TurnDetection(
        silence_duration_ms=EAGERNESS_SILENCE_MS[eagerness],
        create_response=_flag(value, "create_response"),
        interrupt_response=_flag(value, "interrupt_response"),
        eagerness=eagerness,
    )
    value.done()
    return detection


def _milliseconds(fields: Fields, key: str, default: int) -> int:
    value = fields.optional_number(key)
    if value is None:
        return default
    if value != int(value) or not 0 <= value <= 10_000:
        raise ClientEventError(
            "invalid_value",
            f"{fields.param(key)} must be a whole number of milliseconds from 0 to 10000",
            param=fields.param(key),
        )
    return int(value)


def _flag(fields: Fields, key: str) -> bool:
    value = fields.raw(key)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ClientEventError(
            "invalid_type", f"{fields.param(key)} must be a boolean", param=fields.param(key)
        )
    return value


class TurnDetectionState:
    """Where server VAD stands in one session: the detector generation, the samples it
    has heard, and the turn in progress."""

    def __init__(self) -> None:
        self.generation = 0
        self.num_heard = 0  # samples handed to the detector in this generation
        self.in_speech = False
        self.item_id: str | None = None  # the user item the speech will become
        self.response_pending = False  # commit happened while a response was active

    def restart(self) -> None:
        self.generation += 1
        self.num_heard = 0
        self.in_speech = False
        self.item_id = None
        self.response_pending = False
