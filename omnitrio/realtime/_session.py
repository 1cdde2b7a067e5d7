"""The Realtime connection as a state machine: client frames in, server events out.

Sans-io, like h11: no sockets, no trio. The server feeds each WebSocket message
to ``receive`` and each pipeline item to ``output``, and sends what they return.

States
------
A session is NEW until ``start()`` (which returns session.created), then OPEN
for the rest of the connection. An OPEN session holds the input audio buffer
(appended, not committed), the committed audio not yet answered, the
conversation, the settings, and one response state::

    IDLE --response.create--> ACTIVE --finish()--> IDLE
                                |
                          response.cancel
                                v
                            CANCELLING --finish()--> IDLE

``_TRANSITIONS`` below is that diagram as data, and the only authority: the
state is changed in one place, ``_move``, which follows it (the response objects
of _response.py only shape events; they hold no state of the machine). Everything
else the client may
send in any OPEN state: session.update (applies to the next response),
input_audio_buffer.append / commit / clear, conversation.item.create.

With server_vad turn detection (see _turns.py) the server also reports the
detector's findings through ``speech_started`` / ``speech_stopped`` (those methods
live in _vad_turns.py, a room of their own shared by both transports); a turn
that ends while a response is still ACTIVE or CANCELLING starts its response
from ``finish()``. At a pause the detector reports (``speech_paused``) the session
holds a speculation: the request the turn's response would get, which the server
may run ahead, unseen; it is dropped when speech goes on, and a response whose
request is equal takes it over (_speculation.py).

Refused (an error event; the state does not change): response.create unless
IDLE (``conversation_already_has_active_response``), response.cancel when IDLE
(``response_cancel_not_active``). A second response.cancel while CANCELLING
returns nothing: the cancel is already under way.

In CANCELLING, ``output`` returns nothing (the client asked for no more
deltas) and ``finish`` reports status ``cancelled`` whatever status it is given.
Calling ``output`` / ``finish`` for a response that is not ACTIVE or CANCELLING,
or ``receive`` while NEW, is the server's bug: ``LocalProtocolError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._items import AudioInput, JsonValue, Request, VisibleItem
from ..tools import arguments_json
from ._config import SessionConfig
from ._conversation import Conversation, Item, played_text
from ._encode import decode_frame, encode_event
from ._errors import ClientEventError, LocalProtocolError, quote
from ._events import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ClientEvent,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputAudioClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    client_event_id,
    parse_client_event,
)
from ._outputs import CancelResponse, Output, ResponseState, StartResponse, StopPlayback
from ._response import STATUSES, ActiveResponse, Status
from ._server_events import ServerEvent, error_event, new_id
from ._settings import Settings, SettingsPatch, default_settings
from ._shapes import item_events, item_object, session_object
from ._speculation import DropSpeculation, SpeculationState
from ._turns import IDLE_KEEP_MS, SideStageAudio, TurnDetectionState
from ._vad_turns import ServerVadTurns

# (state, trigger) -> next state. A trigger missing for a state is refused there.
_TRANSITIONS: Mapping[tuple[ResponseState, str], ResponseState] = {
    ("IDLE", "response.create"): "ACTIVE",
    ("ACTIVE", "output"): "ACTIVE",
    ("ACTIVE", "response.cancel"): "CANCELLING",
    ("ACTIVE", "finish"): "IDLE",
    ("CANCELLING", "output"): "CANCELLING",  # shows nothing
    ("CANCELLING", "response.cancel"): "CANCELLING",  # already under way: no reply
    ("CANCELLING", "finish"): "IDLE",
}


@dataclass(frozen=True)
class SessionStatistics:
    """A snapshot of a session's state, for tests and metrics."""

    input_audio_buffered_s: float  # appended, not committed
    input_audio_committed_s: float  # committed, not yet handed to a response
    num_items: int  # conversation items
    num_responses: int  # responses started
    num_errors: int  # error events for bad client input
    response_state: ResponseState
    active_response_id: str | None


class RealtimeSession(ServerVadTurns):
    """One Realtime WebSocket connection's protocol state. See the module docstring."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self._started = False
        self._settings: Settings = default_settings(config)
        self._conversation = Conversation(
            config.max_conversation_items, config.max_conversation_bytes
        )
        self._conversation_id = new_id("conv")
        self._buffer = bytearray()
        self._committed: list[tuple[str, bytes]] = []  # (user audio item id, PCM16)
        self._response: ActiveResponse | None = None
        self._state: ResponseState = "IDLE"  # changed only by _move
        self._num_responses = 0
        self._num_errors = 0
        self._listener = TurnDetectionState()
        self._speculation = SpeculationState()
        self._instructions: tuple[str, int] = ("", 0)  # the last counted, its UTF-8 bytes

    @property
    def active_response_id(self) -> str | None:
        """The response that output() and finish() take, until finish() (None when IDLE)."""
        return None if self._response is None else self._response.id

    @property
    def active_item_id(self) -> str | None:
        """The assistant item the active response writes (None: none yet, or IDLE)."""
        return None if self._response is None else self._response.item_id

    @property
    def listening_generation(self) -> int | None:
        """The turn detector generation SideStageAudio goes to (None: turn detection is off)."""
        return None if self._settings.turn_detection is None else self._listener.generation

    def _move(self, trigger: str) -> ResponseState:
        """Take ``trigger`` in the current state (the one place the state changes)."""
        after = self._transition(trigger)
        if after is None:
            raise LocalProtocolError(f"{trigger} is not allowed in state {self._state}")
        self._state = after
        return after

    def start(self) -> list[ServerEvent]:
        """Open the session: [session.created]. Call once, before anything else."""
        if self._started:
            raise LocalProtocolError("start() was already called on this session")
        self._started = True
        return [self._session_event("session.created")]

    def configure(self, session: object) -> None:
        """Apply a session object before ``start()`` (a WebRTC call's ``session`` form
        field, or a client secret's): as session.update would, except that a field it
        refuses raises ``ClientEventError`` (the request that carried it is refused)."""
        if self._started:
            raise LocalProtocolError("configure() comes before start()")
        event = parse_client_event({"type": "session.update", "session": session}, self.config)
        if not isinstance(event, SessionUpdate):
            raise LocalProtocolError("a session.update parsed as another event")
        if event.errors:
            raise event.errors[0]
        self._settings = self._settings.apply(event.patch)

    def receive(self, frame: str | bytes) -> list[Output]:
        """Handle one WebSocket message (str: text frame, bytes: binary frame).

        Never raises on anything the peer sends: a bad frame or event gives an
        ``error`` server event, and the session stays as it was.
        """
        if not self._started:
            raise LocalProtocolError("call start() and send session.created before receive()")
        message: object = None
        try:
            config = self.config
            message = decode_frame(
                frame, config.framing, config.max_message_bytes, config.max_frame_values
            )
            event = parse_client_event(message, self.config)
            errors = event.errors if isinstance(event, SessionUpdate) else ()
            self._num_errors += len(errors)
            refused: list[Output] = [error_event(e, client_event_id(message)) for e in errors]
            return refused + self._handle(event)
        except ClientEventError as error:
            self._num_errors += 1
            return [error_event(error, client_event_id(message))]

    def output(self, response_id: str, item: VisibleItem) -> list[ServerEvent]:
        """Server events for one pipeline item of the active response.

        Returns nothing once the client cancelled the response, for items the
        response's modalities do not show (audio in a text-only response) and for
        Events other than a ``transcript`` (see docs/protocol.md).
        """
        response = self._require_response(response_id, "output")
        if self._move("output") == "CANCELLING":
            return []  # the client asked for no more deltas
        return response.output(item, self._conversation)

    def finish(
        self,
        response_id: str,
        status: Status,
        error: str | None = None,
        *,
        retry_after_s: float | None = None,
    ) -> list[ServerEvent | StartResponse | DropSpeculation]:
        """Close the response: *.done events with the full text, then response.done.

        ``error`` is shown in ``status_details`` when ``status`` is "failed", with
        ``retry_after_s`` (the pipeline refused or shed the response: when a new one
        may be admitted) as its ``retry_after_ms``. After
        a response.cancel from the client the status is "cancelled" regardless.
        A server_vad turn committed meanwhile starts its response here (StartResponse).
        """
        if status not in STATUSES:
            raise LocalProtocolError(f"finish() status must be one of {STATUSES}, not {status!r}")
        response = self._require_response(response_id, "finish")
        cancelled = self._state == "CANCELLING"
        self._move("finish")
        self._response = None
        events: list[ServerEvent | StartResponse | DropSpeculation] = []
        events += response.finish(
            status, error, self._conversation, cancelled=cancelled, retry_after_s=retry_after_s
        )
        if self._listener.response_pending:
            self._listener.response_pending = False
            events += self._auto_response()
        return events

    def _auto_response(self) -> list[ServerEvent | StartResponse | DropSpeculation]:
        try:
            return [
                out
                for out in self._create_response(ResponseCreate(SettingsPatch(), ()))
                if isinstance(out, ServerEvent | StartResponse | DropSpeculation)
            ]
        except ClientEventError as error:
            self._num_errors += 1
            return [error_event(error, None)]

    def hear(self, pcm16: bytes) -> list[Output]:
        """Audio from a live input track (a WebRTC call's microphone), at the input rate:
        appended as input_audio_buffer.append would, but never refused. A track never
        stops, so where the buffer would pass ``max_input_audio_s`` its oldest audio
        makes room (without turn detection the buffer holds the last minute or so)."""
        if not self._started:
            raise LocalProtocolError("call start() before hear()")
        committed = sum(len(audio) for _, audio in self._committed)
        over = len(self._buffer) + committed + len(pcm16) - self.config.max_input_audio_bytes
        if over > 0:
            del self._buffer[: over + over % 2]
        try:
            return self._append(pcm16)
        except ClientEventError:
            return []  # the committed audio alone fills the limit: this chunk is dropped

    def played(self, item_id: str | None, played_ms: int) -> list[ServerEvent]:
        """The server stopped playing ``item_id`` after ``played_ms`` (``StopPlayback``):
        its transcript is cut to match, as conversation.item.truncate would cut it."""
        if item_id is None:
            return []
        item = self._conversation.get(item_id)
        response = self._response
        writing = response is not None and response.item_id == item_id
        if item is None or item.role != "assistant" or item.kind != "audio":
            return []
        audio_ms = response.audio_ms if response is not None and writing else item.audio_ms
        outs = self._truncate(item_id, min(played_ms, audio_ms))
        return [out for out in outs if isinstance(out, ServerEvent)]

    def encode(self, event: ServerEvent) -> str | bytes:
        """``event`` as a WebSocket message with a fresh ``event_id``: str (JSON) or bytes."""
        return encode_event(event, new_id("event"), self.config.framing)

    def statistics(self) -> SessionStatistics:
        rate = self.config.input_sample_rate_hz
        committed = sum(len(pcm16) for _, pcm16 in self._committed)
        return SessionStatistics(
            input_audio_buffered_s=len(self._buffer) / 2 / rate,
            input_audio_committed_s=committed / 2 / rate,
            num_items=len(self._conversation),
            num_responses=self._num_responses,
            num_errors=self._num_errors,
            response_state=self._state,
            active_response_id=self.active_response_id,
        )

    def held_bytes(self) -> int:
        """What the session holds of its client's input, in bytes: audio appended or
        committed, conversation text, instructions (UTF-8; the server's per-client
        total, issue 42)."""
        committed = sum(len(pcm16) for _, pcm16 in self._committed)
        text = self._settings.instructions
        if text is not self._instructions[0]:  # encoded once per new text, not per frame
            self._instructions = (text, len(text.encode()))
        return len(self._buffer) + committed + self._conversation.num_bytes + self._instructions[1]

    def _require_response(self, response_id: str, call: str) -> ActiveResponse:
        allowed = self._transition(call) is not None
        if not allowed or self._response is None or self._response.id != response_id:
            raise LocalProtocolError(
                f"{call}({response_id!r}): the active response is {self.active_response_id!r}; "
                "call finish() once per response it started"
            )
        return self._response

    def _session_event(self, name: str) -> ServerEvent:
        return ServerEvent(name, {"session": session_object(self._settings, self.config)})

    def _handle(self, event: ClientEvent) -> list[Output]:
        match event:
            case SessionUpdate(patch, _):
                before = self._settings.turn_detection
                self._settings = self._settings.apply(patch)
                if self._settings.turn_detection == before:
                    return [self._session_event("session.updated")]
                self._listener.restart()  # a new detector: what the old one heard is gone
                return [*self._speculation.drop(), self._session_event("session.updated")]
            case AudioAppend(pcm16):
                return self._append(pcm16)
            case AudioCommit():
                return list(self._commit())
            case AudioClear():
                self._buffer.clear()
                return [ServerEvent("input_audio_buffer.cleared")]
            case ItemCreate():
                return self._create_item(event)
            case ItemTruncate(item_id, played_ms):
                return self._truncate(item_id, played_ms)
            case ItemDelete(item_id):
                return self._delete(item_id)
            case ItemRetrieve(item_id):
                return self._retrieve(item_id)
            case ResponseCreate():
                return self._create_response(event)
            case ResponseCancel(response_id):
                return self._cancel(response_id)
            case OutputAudioClear():
                return [StopPlayback()]

    def _create_item(self, event: ItemCreate) -> list[Output]:
        if event.kind == "function_call_output" and (
            event.call_id is None or self._conversation.call(event.call_id) is None
        ):
            raise ClientEventError(
                "invalid_value",
                f"item.call_id {quote(event.call_id or '')} names no function_call item of the "
                "conversation; send the output of a call the model made",
                param="item.call_id",
            )
        if event.kind == "function_call":
            try:
                arguments_json(event.text)  # the rule chat completions' tool_calls meet too
            except ValueError as exc:
                raise ClientEventError(
                    "invalid_value", f"item.arguments: {exc}", param="item.arguments"
                ) from None
        item_id = event.item_id or new_id("item")
        item = Item(
            item_id, event.role, event.kind, event.text, call_id=event.call_id, name=event.name
        )
        previous = self._conversation.add(item, event.previous_item_id)
        return list(item_events(item, previous, self.config.dialect))

    def _truncate(self, item_id: str, played_ms: int) -> list[Output]:
        """Cut an assistant audio item's transcript to the audio the client played."""
        response = self._response
        writing = response is not None and response.item_id == item_id
        item = self._conversation.existing(item_id)
        if item.role != "assistant" or item.kind != "audio":
            raise ClientEventError(
                "invalid_value",
                f"item {quote(item_id)} is a {item.role} {item.kind} item; only an "
                "assistant's audio can be truncated",
                param="item_id",
            )
        audio_ms = response.audio_ms if response is not None and writing else item.audio_ms
        if played_ms > audio_ms:
            raise ClientEventError(
                "invalid_value",
                f"audio_end_ms {played_ms} is past the end of the item's audio ({audio_ms} ms)",
                param="audio_end_ms",
            )
        if response is not None and writing:
            response.truncate(played_ms)  # the transcript is cut when the response closes
        else:
            text = played_text(item.text or "", item.audio_ms, played_ms)
            cut = Item(item.id, item.role, item.kind, text, item.status, played_ms)
            self._conversation.replace(cut)
        fields: dict[str, JsonValue] = {
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": played_ms,
        }
        return [ServerEvent("conversation.item.truncated", fields)]

    def _delete(self, item_id: str) -> list[Output]:
        response = self._response
        if response is not None and response.item_id == item_id:
            raise ClientEventError(
                "item_in_progress",
                f"item {quote(item_id)} is being written by response {response.id}; "
                "cancel it and wait for its response.done first",
                param="item_id",
            )
        self._conversation.remove(item_id)
        self._committed = [(i, pcm16) for i, pcm16 in self._committed if i != item_id]
        return [ServerEvent("conversation.item.deleted", {"item_id": item_id})]

    def _retrieve(self, item_id: str) -> list[Output]:
        """The item as the conversation holds it: its text and transcripts (input audio
        is not kept after the response that used it, so no audio)."""
        item = self._conversation.existing(item_id)
        shown = item_object(item, self.config.dialect)
        return [ServerEvent("conversation.item.retrieved", {"item": shown})]

    def _append(self, pcm16: bytes) -> list[Output]:
        held = len(self._buffer) + sum(len(audio) for _, audio in self._committed)
        limit = self.config.max_input_audio_bytes
        if held + len(pcm16) > limit:
            total_s = (held + len(pcm16)) / 2 / self.config.input_sample_rate_hz
            raise ClientEventError(
                "input_audio_buffer_full",
                f"input audio would reach {total_s:.1f} s, "
                f"over the limit of {self.config.max_input_audio_s:g} s; commit it and send "
                "response.create, or clear it",
                param="audio",
            )
        self._buffer += pcm16
        detection = self._settings.turn_detection
        if detection is None:
            return []
        listener = self._listener
        listener.num_heard += len(pcm16) // 2
        if not listener.in_speech:  # keep only what a turn starting now could need
            keep_ms = detection.prefix_padding_ms + IDLE_KEEP_MS
            keep_bytes = 2 * (keep_ms * self.config.input_sample_rate_hz // 1000)
            del self._buffer[:-keep_bytes]
        return [SideStageAudio(pcm16, listener.generation, detection.options())]

    def _commit(
        self, item_id: str | None = None, num_bytes: int | None = None
    ) -> list[ServerEvent]:
        """Commit the buffer (its first ``num_bytes`` when given) as a user audio item."""
        if not self._buffer:
            raise ClientEventError(
                "input_audio_buffer_commit_empty",
                "the input audio buffer is empty; append audio before committing",
            )
        if item_id is None and self._listener.in_speech:
            item_id = self._listener.item_id  # a manual commit in mid-speech ends the turn
            self._listener.in_speech = False
        item = Item(item_id or new_id("item"), "user", "audio", None)
        previous = self._conversation.add(item)
        end = len(self._buffer) if num_bytes is None else num_bytes
        self._committed.append((item.id, bytes(self._buffer[:end])))
        del self._buffer[:end]
        committed = ServerEvent(
            "input_audio_buffer.committed", {"item_id": item.id, "previous_item_id": previous}
        )
        return [committed, *item_events(item, previous, self.config.dialect)]

    def _transition(self, trigger: str) -> ResponseState | None:
        return _TRANSITIONS.get((self._state, trigger))

    def _create_response(self, event: ResponseCreate) -> list[Output]:
        self._conversation.check_room_for_response()
        if self._transition("response.create") is None:
            advice = (
                "is being cancelled; wait for its response.done"
                if self._state == "CANCELLING"
                else "is still active; wait for its response.done or send response.cancel"
            )
            raise ClientEventError(
                "conversation_already_has_active_response",
                f"response {self.active_response_id} {advice}",
            )
        settings = self._settings.apply(event.patch)
        settings.check_tool_choice()
        request = self._request(settings, b"".join(pcm16 for _, pcm16 in self._committed))
        response = ActiveResponse(
            new_id("resp"),
            request,
            settings,
            self.config,
            conversation_id=self._conversation_id,
            metadata=event.metadata,
            audio_item_id=self._committed[-1][0] if self._committed else None,
        )
        self._committed.clear()
        self._move("response.create")
        self._response = response
        self._num_responses += 1
        taken, drops = self._speculation.take(request)
        return [*drops, response.created_event(), StartResponse(response.id, request, taken)]

    def _request(self, settings: Settings, audio: bytes) -> Request:
        """A response's pipeline request: the conversation, the audio not yet answered."""
        return Request(
            text=self._conversation.as_text(),
            audio=AudioInput(audio, self.config.input_sample_rate_hz) if audio else None,
            options=settings.options(),
        )

    def _cancel(self, response_id: str | None) -> list[Output]:
        response = self._response
        if self._transition("response.cancel") is None or response is None:
            raise ClientEventError(
                "response_cancel_not_active", "there is no active response to cancel"
            )
        if response_id not in (None, response.id):
            raise ClientEventError(
                "response_cancel_not_active",
                f"response {quote(response_id)} is not the active response ({response.id})",
                param="response_id",
            )
        if self._state == "CANCELLING":
            self._move("response.cancel")
            return []  # already under way
        self._move("response.cancel")
        return [CancelResponse(response.id)]
