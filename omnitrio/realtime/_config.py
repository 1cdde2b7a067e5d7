"""What the server decides about a connection before the first event: ids, rates, framing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..tools import ToolLimits

Framing = Literal["json", "msgpack"]
"""How events travel: JSON text frames (the OpenAI protocol) or msgpack binary frames."""

Dialect = Literal["ga", "beta"]
"""Server event names: ``"beta"`` when the client sent ``OpenAI-Beta: realtime=v1``."""

JSON_SUBPROTOCOL = "omnitrio.json.v1"
MSGPACK_SUBPROTOCOL = "omnitrio.msgpack.v1"
OPENAI_SUBPROTOCOL = "realtime"
"""Offered by OpenAI's browser clients (next to ``openai-insecure-api-key.*``): JSON."""
_SUBPROTOCOLS: dict[str, Framing] = {
    JSON_SUBPROTOCOL: "json",
    MSGPACK_SUBPROTOCOL: "msgpack",
    OPENAI_SUBPROTOCOL: "json",
}


def select_subprotocol(offered: Sequence[str]) -> tuple[Framing, str | None]:
    """The framing for a ``Sec-WebSocket-Protocol`` offer, and the subprotocol to answer.

    The first offered name we know wins (a client lists them in its order of
    preference). With none we know (the OpenAI Python SDK offers none) the
    framing is JSON and no subprotocol is answered.
    """
    for name in offered:
        framing = _SUBPROTOCOLS.get(name.strip())
        if framing is not None:
            return framing, name.strip()
    return "json", None


@dataclass(frozen=True)
class SessionConfig:
    """One connection's fixed settings, made by the server when the WebSocket opens."""

    session_id: str
    model: str
    framing: Framing = "json"
    dialect: Dialect = "ga"
    input_sample_rate_hz: int = 24000
    output_sample_rate_hz: int = 24000
    max_input_audio_s: float = 60.0
    max_message_bytes: int = 1 << 20
    max_frame_values: int = 20_000
    """A frame holding more arrays, maps and elements is refused (bounds decoding work)."""
    max_conversation_items: int = 1024
    max_conversation_bytes: int = 1 << 20
    """Text (and transcripts) a conversation may hold: it is sent with every response."""
    server_vad: bool = False
    """The pipeline has a turn detector: server_vad is available (and the default)."""
    tool_limits: ToolLimits = field(default_factory=ToolLimits)
    """What a session's or a response's tools may cost (the server's settings)."""
    max_output_tokens: int = 4096
    """A response's ``max_output_tokens`` above this is refused (``"inf"``: the pipeline's)."""
    transcription_model: str | None = None
    """The pipeline's speech-recognition stage, as sessions name it (None: it has none)."""
    voices: tuple[str, ...] = ()
    """The voice names a session may choose; empty: any (the pipeline decides)."""
    webrtc: bool = False
    """The session's audio travels on WebRTC tracks (``POST /v1/realtime/calls``): the
    server plays the answer, so ``output_audio_buffer.clear`` is the client's to send."""

    def __post_init__(self) -> None:
        if self.framing not in ("json", "msgpack"):
            raise ValueError(f"framing must be 'json' or 'msgpack', not {self.framing!r}")
        if self.dialect not in ("ga", "beta"):
            raise ValueError(f"dialect must be 'ga' or 'beta', not {self.dialect!r}")
        for name in (
            "input_sample_rate_hz",
            "output_sample_rate_hz",
            "max_message_bytes",
            "max_frame_values",
            "max_conversation_items",
            "max_conversation_bytes",
            "max_output_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if not (math.isfinite(self.max_input_audio_s) and self.max_input_audio_s > 0):
            raise ValueError(f"max_input_audio_s must be positive, not {self.max_input_audio_s!r}")

    @property
    def max_input_audio_bytes(self) -> int:
        """``max_input_audio_s`` of PCM16 mono at the input rate, in bytes."""
        return int(self.max_input_audio_s * self.input_sample_rate_hz) * 2
