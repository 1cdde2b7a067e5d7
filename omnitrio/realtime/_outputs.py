"""What a ``RealtimeSession`` returns besides server events: what the server must do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._items import Request
from ._server_events import ServerEvent
from ._speculation import DropSpeculation, Speculate
from ._turns import SideStageAudio

ResponseState = Literal["IDLE", "ACTIVE", "CANCELLING"]


@dataclass(frozen=True)
class StartResponse:
    """The server must open a pipeline stream for ``request`` and feed its items to output()."""

    response_id: str
    request: Request
    speculation_id: str | None = None
    """The speculation (``Speculate``) whose items are this response's: its request is
    equal, so the server sends what it kept and reads on from its stream."""


@dataclass(frozen=True)
class CancelResponse:
    """The server must cancel that response's pipeline stream, then call finish()."""

    response_id: str


@dataclass(frozen=True)
class StopPlayback:
    """The server must stop playing the answer's audio now, where it plays it (a WebRTC
    call: barge-in, or the client's output_audio_buffer.clear), and report what was
    played with ``played()``. A WebSocket client plays the audio itself: ignored there."""


Output = (
    ServerEvent
    | StartResponse
    | CancelResponse
    | SideStageAudio
    | Speculate
    | DropSpeculation
    | StopPlayback
)
"""What the session returns: events to send, and what the server must do."""
