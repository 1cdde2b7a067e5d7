"""Server VAD in a session: what the turn detector's findings do to the protocol.

``RealtimeSession`` (``_session.py``) keeps the protocol: its states, the buffer, the
conversation, responses. With server_vad (or semantic_vad) turn detection the server
also reports the detector's findings for a transport's input audio (the WebSocket's
appends or a WebRTC call's microphone, alike); these methods take them: speech
starting (barge-in: the answer is cancelled and its playing stopped), speech stopping
(the turn is committed and answered), a pause (a speculative answer held) and a failed
detector (turn detection goes off). They are the session's own methods, kept in this
room of their own; they read and change the session's state through the attributes
declared here, which ``RealtimeSession.__init__`` sets.
"""

from __future__ import annotations

import dataclasses

from .._items import JsonValue, Request
from ._config import SessionConfig
from ._errors import ClientEventError
from ._outputs import CancelResponse, ResponseState, StartResponse, StopPlayback
from ._response import ActiveResponse
from ._server_events import ServerEvent, error_event, new_id, safe_text
from ._settings import Settings
from ._speculation import DropSpeculation, Speculate, SpeculationState
from ._turns import END_PADDING_MS, TurnDetectionState


class ServerVadTurns:
    """The server-VAD half of ``RealtimeSession`` (see the module docstring)."""

    config: SessionConfig
    _settings: Settings
    _listener: TurnDetectionState
    _speculation: SpeculationState
    _buffer: bytearray
    _committed: list[tuple[str, bytes]]
    _response: ActiveResponse | None
    _state: ResponseState
    _num_errors: int

    # The session's own steps these methods take (``_session.py``).
    def _move(self, trigger: str) -> ResponseState:
        raise NotImplementedError

    def _transition(self, trigger: str) -> ResponseState | None:
        raise NotImplementedError

    def _commit(
        self, item_id: str | None = None, num_bytes: int | None = None
    ) -> list[ServerEvent]:
        raise NotImplementedError

    def _auto_response(self) -> list[ServerEvent | StartResponse | DropSpeculation]:
        raise NotImplementedError

    def _request(self, settings: Settings, audio: bytes) -> Request:
        raise NotImplementedError

    def _session_event(self, name: str) -> ServerEvent:
        raise NotImplementedError

    def speech_started(
        self, generation: int, audio_start_ms: int
    ) -> list[ServerEvent | CancelResponse | DropSpeculation | StopPlayback]:
        """The turn detector heard speech start: speech_started, and barge-in on an answer
        (and a speculation held is dropped: the speech goes on)."""
        detection = self._settings.turn_detection
        listener = self._listener
        drops = self._speculation.drop()
        if detection is None or generation != listener.generation or listener.in_speech:
            return [*drops]  # about audio from before turn_detection changed
        listener.in_speech, listener.response_pending = True, False
        listener.item_id = new_id("item")
        rate = self.config.input_sample_rate_hz
        buffer_start = listener.num_heard - len(self._buffer) // 2
        drop = audio_start_ms * rate // 1000 - buffer_start
        if drop > 0:
            del self._buffer[: 2 * drop]
        fields: dict[str, JsonValue] = {
            "audio_start_ms": audio_start_ms,
            "item_id": listener.item_id,
        }
        events: list[ServerEvent | CancelResponse | DropSpeculation | StopPlayback] = [
            *drops,
            ServerEvent("input_audio_buffer.speech_started", fields),
        ]
        if not detection.interrupt_response:
            return events
        events.append(StopPlayback())
        response = self._response
        if response and self._state == "ACTIVE":
            self._move("response.cancel")
            events.append(CancelResponse(response.id))
        return events

    def speech_stopped(
        self, generation: int, audio_end_ms: int
    ) -> list[ServerEvent | StartResponse | DropSpeculation]:
        """The turn detector heard speech end: speech_stopped, commit, and the response."""
        detection = self._settings.turn_detection
        listener = self._listener
        if detection is None or generation != listener.generation or not listener.in_speech:
            return []
        listener.in_speech = False
        item_id = listener.item_id or new_id("item")
        fields: dict[str, JsonValue] = {"audio_end_ms": audio_end_ms, "item_id": item_id}
        events: list[ServerEvent | StartResponse | DropSpeculation] = [
            ServerEvent("input_audio_buffer.speech_stopped", fields)
        ]
        turn_bytes = self._turn_bytes(audio_end_ms)
        if not turn_bytes:
            return events
        try:
            events += self._commit(item_id, turn_bytes)
        except ClientEventError as error:
            self._num_errors += 1
            return [*events, error_event(error, None)]
        if detection.create_response:
            if self._response is None:
                events += self._auto_response()
            else:
                listener.response_pending = True
        return events

    def speculate(self, generation: int, audio_end_ms: int) -> Request | None:
        """The request the turn's response would get if the turn ended at ``audio_end_ms``
        (the detector heard a pause there), or None when a turn ending now would not
        start a response at once. Changes nothing (``speech_paused`` holds it).
        """
        detection = self._settings.turn_detection
        listener = self._listener
        if (
            detection is None
            or not detection.create_response
            or generation != listener.generation
            or not listener.in_speech
            or self._transition("response.create") is None
        ):
            return None
        turn_bytes = self._end_padding_bytes(audio_end_ms)
        if not 0 < turn_bytes <= len(self._buffer):
            return None  # the audio up to the turn's end has not all arrived
        committed = b"".join(pcm16 for _, pcm16 in self._committed)
        return self._request(self._settings, committed + bytes(self._buffer[:turn_bytes]))

    def speech_paused(
        self, generation: int, audio_end_ms: int
    ) -> list[Speculate | DropSpeculation]:
        """The turn detector heard a pause after speech ending at ``audio_end_ms``: the
        speculation held before is dropped, and the request a turn ending there would
        get is held as the new one (``Speculate``), when it would start a response at
        once. The server may run it now; a response takes it over only if its request
        is equal (see _speculation.py), and nothing of it is sent before that."""
        request = self.speculate(generation, audio_end_ms)
        if request is None:
            return list(self._speculation.drop())
        return self._speculation.hold(request)

    def speech_resumed(self) -> list[DropSpeculation]:
        """The turn detector heard speech come back after a pause: drop the speculation."""
        return self._speculation.drop()

    def turn_detection_failed(
        self, generation: int, why: str
    ) -> list[ServerEvent | DropSpeculation]:
        """The turn detector failed: turn detection goes off (the client commits by hand
        from now on) and the client gets a ``server_error`` saying so."""
        if self._settings.turn_detection is None or generation != self._listener.generation:
            return []
        self._settings = dataclasses.replace(self._settings, turn_detection=None)
        self._listener.restart()
        message = (
            f"turn detection failed ({why}) and is now off for this session; "
            "commit the input audio and send response.create"
        )
        error: dict[str, JsonValue] = {
            "type": "server_error",
            "code": "turn_detection_failed",
            "message": safe_text(message),
            "param": None,
            "event_id": None,
        }
        return [
            *self._speculation.drop(),
            ServerEvent("error", {"error": error}),
            self._session_event("session.updated"),
        ]

    def _turn_bytes(self, audio_end_ms: int) -> int:
        """How many bytes of the buffer a turn whose speech ends at ``audio_end_ms`` commits:
        up to ``END_PADDING_MS`` past the end; later audio stays for the next turn."""
        return min(len(self._buffer), self._end_padding_bytes(audio_end_ms))

    def _end_padding_bytes(self, audio_end_ms: int) -> int:
        """Bytes of the buffer from its start to ``END_PADDING_MS`` past ``audio_end_ms``."""
        rate = self.config.input_sample_rate_hz
        buffer_start = self._listener.num_heard - len(self._buffer) // 2
        return max(0, 2 * ((audio_end_ms + END_PADDING_MS) * rate // 1000 - buffer_start))
