"""One response: pipeline items in, server events out, and the closing events.

A function call from the LLM stage (events ``tool_call``, ``tool_call.arguments``,
``tool_call.done``; see stages/voice/llm.py), folded by the ``AnswerAssembler`` that
chat completions use too, is an output item of its own, of type ``function_call``,
with response.function_call_arguments.delta / .done (the answer's first call; a
Realtime response carries one).

A response has one output item (an assistant message) with one content part:
an ``audio`` part (audio deltas plus transcript deltas) when the response's
modalities include audio, else a ``text`` part. The first TextDelta or
AudioChunk opens both; ``finish`` closes whatever was opened, then sends
response.done.

Usage is counted honestly, without a tokenizer (see docs/protocol.md):

- input text tokens: UTF-8 bytes of the request's text and instructions;
- output text tokens: text deltas sent;
- audio tokens, input and output: one per 100 ms of audio, rounded up.
"""

from __future__ import annotations

import math
from typing import Literal

from .._answer import AnswerAssembler, AnswerEvent, CallArguments, CallDone, CallStarted
from .._items import AudioChunk, Event, JsonValue, Request, TextDelta, VisibleItem
from ..tools import TOOL_EVENTS
from ._config import SessionConfig
from ._conversation import Conversation, Item, ItemStatus, played_text
from ._errors import LocalProtocolError
from ._server_events import ServerEvent, named, new_id, safe_text
from ._settings import Settings
from ._shapes import item_done_event, item_events, item_object, response_object

Status = Literal["completed", "cancelled", "failed", "incomplete"]
STATUSES: tuple[Status, ...] = ("completed", "cancelled", "failed", "incomplete")
AUDIO_TOKENS_PER_S = 10
TRANSCRIPT_EVENT = "transcript"
"""The pipeline Event name mapped to an input audio transcript (``data["text"]``)."""


def audio_tokens(num_samples: int, sample_rate_hz: int) -> int:
    """Audio tokens for ``num_samples`` samples: one per 100 ms, rounded up."""
    return -(-num_samples * AUDIO_TOKENS_PER_S // sample_rate_hz)


class ActiveResponse:
    """The state of the one response a session runs at a time."""

    def __init__(
        self,
        response_id: str,
        request: Request,
        settings: Settings,
        config: SessionConfig,
        *,
        conversation_id: str,
        metadata: tuple[tuple[str, str], ...],
        audio_item_id: str | None,
    ) -> None:
        self.id = response_id
        self.settings = settings
        self._config = config
        self._conversation_id = conversation_id
        self._metadata = metadata
        self._audio_item_id = audio_item_id  # the turn's last user audio item, for transcripts
        self._with_audio = "audio" in settings.output_modalities
        self._item: Item | None = None  # the assistant message, once opened
        self._previous_item_id: str | None = None
        self._text: list[str] = []
        self._num_text_deltas = 0
        self._num_output_samples = 0
        self._played_ms: int | None = None  # conversation.item.truncate: what the client played
        self._call: Item | None = None  # a function call, once the model starts one
        self._call_index = 0  # its output_index
        self._call_previous_id: str | None = None
        self._answer = AnswerAssembler()  # folds the tool-call events
        instructions_bytes = len(settings.instructions.encode("utf-8"))
        self._input_text_tokens = len(request.text.encode("utf-8")) + instructions_bytes
        input_samples = len(request.audio.pcm16) // 2 if request.audio else 0
        self._input_audio_tokens = audio_tokens(input_samples, config.input_sample_rate_hz)
        self._input_audio_s = input_samples / config.input_sample_rate_hz

    def _object(
        self,
        status: str,
        *,
        status_details: dict[str, JsonValue] | None = None,
        output: tuple[JsonValue, ...] = (),
        usage: dict[str, JsonValue] | None = None,
    ) -> dict[str, JsonValue]:
        return response_object(
            self.id,
            self.settings,
            self._config,
            conversation_id=self._conversation_id,
            metadata=self._metadata,
            status=status,
            status_details=status_details,
            output=output,
            usage=usage,
        )

    @property
    def item_id(self) -> str | None:
        """The assistant item this response is writing (None until its first output)."""
        return None if self._item is None else self._item.id

    @property
    def audio_ms(self) -> int:
        """The output audio sent so far, in milliseconds."""
        return self._num_output_samples * 1000 // self._config.output_sample_rate_hz

    def truncate(self, played_ms: int) -> None:
        """The client played only ``played_ms`` of the audio: the item's transcript is cut
        to match when the response closes."""
        self._played_ms = played_ms

    def created_event(self) -> ServerEvent:
        return ServerEvent("response.created", {"response": self._object("in_progress")})

    def _where(self, item: Item) -> dict[str, JsonValue]:
        return {"response_id": self.id, "item_id": item.id, "output_index": 0, "content_index": 0}

    def _part(self, text: str) -> dict[str, JsonValue]:
        if self._with_audio:
            return {"type": "audio", "transcript": text}
        return {"type": "text", "text": text}

    def _open(self, conversation: Conversation) -> tuple[Item, list[ServerEvent]]:
        if self._item is not None:
            return self._item, []
        kind: Literal["text", "audio"] = "audio" if self._with_audio else "text"
        item = Item(new_id("item"), "assistant", kind, None, status="in_progress")
        self._item = item
        self._previous_item_id = conversation.add(item, checked=False)
        dialect = self._config.dialect
        added: dict[str, JsonValue] = {
            "response_id": self.id,
            "output_index": 0,
            "item": item_object(item, dialect),
        }
        part_added = {**self._where(item), "part": self._part("")}
        return item, [
            ServerEvent("response.output_item.added", added),
            *item_events(item, self._previous_item_id, dialect, done=False),
            ServerEvent("response.content_part.added", part_added),
        ]

    def output(self, visible: VisibleItem, conversation: Conversation) -> list[ServerEvent]:
        """Server events for one pipeline item (none for items this response does not show)."""
        dialect = self._config.dialect
        if isinstance(visible, TextDelta):
            if not visible.text:
                return []
            text = safe_text(visible.text)
            item, events = self._open(conversation)
            self._text.append(text)
            self._num_text_deltas += 1
            kind = "output_audio_transcript" if self._with_audio else "output_text"
            delta = {**self._where(item), "delta": text}
            return [*events, named(dialect, f"response.{kind}.delta", delta)]
        if isinstance(visible, AudioChunk):
            if visible.sample_rate_hz != self._config.output_sample_rate_hz:
                raise LocalProtocolError(
                    f"AudioChunk at {visible.sample_rate_hz} Hz; resample it to the session's "
                    f"output_sample_rate_hz={self._config.output_sample_rate_hz} before output()"
                )
            if not self._with_audio or not visible.pcm16:
                return []
            item, events = self._open(conversation)
            self._num_output_samples += len(visible.pcm16) // 2
            audio = named(dialect, "response.output_audio.delta", self._where(item), visible.pcm16)
            return [*events, audio]
        if isinstance(visible, Event):
            return self._event(visible, conversation)
        raise LocalProtocolError(f"output() takes a VisibleItem, not a {type(visible).__name__}")

    def _call_event(self, event: Event, conversation: Conversation) -> list[ServerEvent]:
        """A function call's item and argument events (see the module docstring)."""
        return [e for part in self._answer.take(event) for e in self._call_part(part, conversation)]

    def _call_part(self, part: AnswerEvent, conversation: Conversation) -> list[ServerEvent]:
        if not isinstance(part, CallStarted | CallArguments | CallDone) or part.index != 0:
            return []  # the answer's later calls: a Realtime response carries one
        call_id = part.call_id
        dialect = self._config.dialect
        if isinstance(part, CallStarted):
            name = part.name
            item = Item(
                new_id("item"),
                "assistant",
                "function_call",
                "",
                "in_progress",
                call_id=call_id,
                name=name,
            )
            self._call = item
            self._call_index = 0 if self._item is None else 1
            self._call_previous_id = conversation.add(item, checked=False)
            added: dict[str, JsonValue] = {
                "response_id": self.id,
                "output_index": self._call_index,
                "item": item_object(item, dialect),
            }
            return [
                ServerEvent("response.output_item.added", added),
                *item_events(item, self._call_previous_id, dialect, done=False),
            ]
        call = self._call
        assert call is not None  # begun by the answer's first CallStarted
        where: dict[str, JsonValue] = {
            "response_id": self.id,
            "item_id": call.id,
            "output_index": self._call_index,
            "call_id": call_id,
        }
        if isinstance(part, CallArguments):
            delta = part.delta
            self._call = Item(
                call.id,
                "assistant",
                "function_call",
                (call.text or "") + delta,
                "in_progress",
                call_id=call_id,
                name=call.name,
            )
            return [
                ServerEvent("response.function_call_arguments.delta", {**where, "delta": delta})
            ]
        arguments = part.arguments
        self._call = Item(
            call.id,
            "assistant",
            "function_call",
            arguments,
            "in_progress",
            call_id=call_id,
            name=call.name,
        )
        done: dict[str, JsonValue] = {**where, "arguments": arguments}
        if dialect == "ga":
            done["name"] = call.name
        return [ServerEvent("response.function_call_arguments.done", done)]

    def _close_call(
        self, call: Item, status: Status, conversation: Conversation
    ) -> list[ServerEvent]:
        item_status: ItemStatus = "completed" if status == "completed" else "incomplete"
        final = Item(
            call.id,
            "assistant",
            "function_call",
            call.text,
            item_status,
            call_id=call.call_id,
            name=call.name,
        )
        self._call = final
        conversation.replace(final)
        item_done: dict[str, JsonValue] = {
            "response_id": self.id,
            "output_index": self._call_index,
            "item": item_object(final, self._config.dialect),
        }
        return [
            ServerEvent("response.output_item.done", item_done),
            *item_done_event(final, self._call_previous_id, self._config.dialect),
        ]

    def _event(self, event: Event, conversation: Conversation) -> list[ServerEvent]:
        if event.name in TOOL_EVENTS:
            return self._call_event(event, conversation)
        # Only a transcript of the turn's input audio has a protocol event; others are internal.
        text = event.data.get("text")
        if event.name != TRANSCRIPT_EVENT or not isinstance(text, str):
            return []
        audio_item = conversation.get(self._audio_item_id) if self._audio_item_id else None
        if audio_item is None:
            return []
        transcript = safe_text(text)
        conversation.replace(Item(audio_item.id, "user", "audio", transcript))
        if self.settings.transcription is None:
            return []  # the conversation keeps the text; the client asked for no events
        usage: dict[str, JsonValue] = {"type": "duration", "seconds": self._input_audio_s}
        fields: dict[str, JsonValue] = {
            "item_id": audio_item.id,
            "content_index": 0,
            "transcript": transcript,
        }
        name = "conversation.item.input_audio_transcription.completed"
        return [ServerEvent(name, {**fields, "usage": usage})]

    def finish(
        self,
        status: Status,
        error: str | None,
        conversation: Conversation,
        *,
        cancelled: bool,
        retry_after_s: float | None = None,
    ) -> list[ServerEvent]:
        """Close the open part and item (with the full text), then response.done.

        ``cancelled``: the client cancelled it (the session's state says so); the
        status is then "cancelled" whatever ``status`` is."""
        if cancelled:
            status = "cancelled"
        events: list[ServerEvent] = []
        output: tuple[JsonValue, ...] = ()
        if self._item is not None:
            events, final = self._close(self._item, status, conversation)
            output = (item_object(final, self._config.dialect),)
        if self._call is not None:
            events += self._close_call(self._call, status, conversation)
            output += (item_object(self._call, self._config.dialect),)
        details = self._status_details(status, error, cancelled, retry_after_s)
        done = self._object(status, status_details=details, output=output, usage=self._usage())
        return [*events, ServerEvent("response.done", {"response": done})]

    def _close(
        self, item: Item, status: Status, conversation: Conversation
    ) -> tuple[list[ServerEvent], Item]:
        dialect = self._config.dialect
        text = "".join(self._text)
        item_status: ItemStatus = "completed" if status == "completed" else "incomplete"
        audio_ms = self.audio_ms
        if self._played_ms is not None:
            text, audio_ms = played_text(text, audio_ms, self._played_ms), self._played_ms
        final = Item(item.id, "assistant", item.kind, text, item_status, audio_ms)
        conversation.replace(final)
        where = self._where(item)
        if self._with_audio:
            events = [
                named(dialect, "response.output_audio.done", where),
                named(
                    dialect, "response.output_audio_transcript.done", {**where, "transcript": text}
                ),
            ]
        else:
            events = [named(dialect, "response.output_text.done", {**where, "text": text})]
        item_done: dict[str, JsonValue] = {
            "response_id": self.id,
            "output_index": 0,
            "item": item_object(final, dialect),
        }
        events += [
            ServerEvent("response.content_part.done", {**where, "part": self._part(text)}),
            ServerEvent("response.output_item.done", item_done),
            *item_done_event(final, self._previous_item_id, dialect),
        ]
        return events, final

    def _status_details(
        self, status: Status, error: str | None, cancelled: bool, retry_after_s: float | None
    ) -> dict[str, JsonValue] | None:
        if status == "completed":
            return None
        details: dict[str, JsonValue] = {"type": status}
        if status == "cancelled" and cancelled:
            details["reason"] = "client_cancelled"
        if status == "failed":
            message = safe_text(error) if error else "the pipeline failed the response"
            failure: dict[str, JsonValue] = {
                "type": "server_error",
                "code": "response_failed",
                "message": message,
            }
            if retry_after_s is not None:
                failure["retry_after_ms"] = math.ceil(max(0.0, retry_after_s) * 1000)
            details["error"] = failure
        return details

    def _usage(self) -> dict[str, JsonValue]:
        output_audio = audio_tokens(self._num_output_samples, self._config.output_sample_rate_hz)
        input_tokens = self._input_text_tokens + self._input_audio_tokens
        output_tokens = self._num_text_deltas + output_audio
        return {
            "total_tokens": input_tokens + output_tokens,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "input_token_details": {
                "text_tokens": self._input_text_tokens,
                "audio_tokens": self._input_audio_tokens,
                "cached_tokens": 0,
            },
            "output_token_details": {
                "text_tokens": self._num_text_deltas,
                "audio_tokens": output_audio,
            },
        }
