"""One chat completion's answer as the wire shows it: no sockets, no quart, no clock.

``ChatAnswer`` folds a pipeline stream's items through the shared ``AnswerAssembler``
(omnitrio/_answer.py, which Realtime responses use too) and formats what it says:
streamed, as the server-sent events of ``chat.completion.chunk`` objects (``opening``,
``chunks`` per item, ``closing``); whole, as one ``chat.completion`` body (``keep``
per item, then ``body``). Audio is resampled to the server's output rate and, for an
encoded format (mp3, opus, aac, flac), encoded as one continuous file across the
deltas; pcm16 and wav stream raw PCM16. The endpoint (_openai_http.py) only moves the
items and the bytes. Tested without a server (tests/server/test_chat_answer.py).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from .._answer import AnswerAssembler, CallArguments, CallStarted, Finished
from .._items import AudioChunk, Event, TextDelta
from ..realtime import new_id
from ._audio import resample_pcm16, wav_bytes
from ._requests import ChatRequest
from ._speech_formats import ENCODED, SpeechEncoder

ChatItem = AudioChunk | TextDelta | Event
"""What a chat answer takes from its stream: text, audio and the LLM stage's events."""

AUDIO_EXPIRES_S = 3600
"""How long after ``created`` an answer's audio id is said to stay valid."""


class ChatAnswer:
    """One chat completion (see the module docstring). Raises ``ImportError`` for an
    encoded audio format on an install without PyAV."""

    def __init__(self, chat: ChatRequest, model: str, rate_hz: int) -> None:
        self.chat = chat
        self.model = model
        self.rate_hz = rate_hz
        self.id = new_id("chatcmpl")
        self.audio_id = new_id("audio")
        self.created = int(time.time())
        self.audio = "audio" in chat.modalities
        format = chat.audio.format if chat.audio is not None else "pcm16"
        encoded = next((f for f in ENCODED if f == format), None)
        self.encoder = None if encoded is None else SpeechEncoder(encoded, rate_hz)
        self.answer = AnswerAssembler()
        self._text: list[str] = []
        self._pcm = bytearray()

    # -- streamed ---------------------------------------------------------------------

    def opening(self) -> bytes:
        """The first chunk: the assistant's role."""
        return self._chunk({"role": "assistant", "content": "" if not self.audio else None})

    def chunks(self, item: ChatItem) -> list[bytes]:
        """The chunks one pipeline item streams as."""
        chunks = []
        for event in self.answer.take(item):
            if isinstance(event, CallStarted):
                function = {"name": event.name, "arguments": ""}
                call = {"index": event.index, "id": event.call_id, "type": "function"}
                chunks.append(self._chunk({"tool_calls": [{**call, "function": function}]}))
            elif isinstance(event, CallArguments):
                delta = {"index": event.index, "function": {"arguments": event.delta}}
                chunks.append(self._chunk({"tool_calls": [delta]}))
            elif isinstance(event, TextDelta):
                if self.audio:
                    audio = {"id": self.audio_id, "transcript": event.text}
                    chunks.append(self._chunk({"audio": audio}))
                else:
                    chunks.append(self._chunk({"content": event.text}))
            elif isinstance(event, AudioChunk):
                pcm = resample_pcm16(event.pcm16, event.sample_rate_hz, self.rate_hz)
                chunks.append(
                    self._audio_chunk(pcm if self.encoder is None else self.encoder.feed(pcm))
                )
        return chunks

    def closing(self) -> list[bytes]:
        """The chunks after the stream's end: the encoder's tail, the finish reason, the
        usage (when ``stream_options.include_usage``), ``[DONE]``."""
        chunks = []
        tail = self.encoder.close() if self.encoder is not None else b""
        if tail:
            chunks.append(self._audio_chunk(tail))
        chunks.append(self._chunk({}, finish=self.finish_reason()))
        options = self.chat.stream_options
        if options is not None and options.include_usage:
            chunks.append(self._data({"choices": [], "usage": self.usage()}))
        chunks.append(b"data: [DONE]\n\n")
        return chunks

    # -- whole ------------------------------------------------------------------------

    def keep(self, item: ChatItem) -> None:
        """Take one pipeline item into the whole answer."""
        for event in self.answer.take(item):
            if isinstance(event, TextDelta):
                self._text.append(event.text)
            elif isinstance(event, AudioChunk):
                self._pcm += resample_pcm16(event.pcm16, event.sample_rate_hz, self.rate_hz)

    def body(self) -> bytes:
        """The ``chat.completion`` object of the items kept, as JSON."""
        calls, text = self.answer.calls, "".join(self._text)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.audio or (calls and not text) else text,
        }
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        if self.audio:
            message["audio"] = {
                "id": self.audio_id,
                "data": base64.b64encode(self._audio_bytes()).decode(),
                "transcript": text,
                "expires_at": self.created + AUDIO_EXPIRES_S,
            }
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason()}
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }
        return json.dumps(body).encode()

    def _audio_bytes(self) -> bytes:
        pcm = bytes(self._pcm)
        if self.encoder is not None:
            return self.encoder.feed(pcm) + self.encoder.close()
        if self.chat.audio is not None and self.chat.audio.format == "wav":
            return wav_bytes(pcm, self.rate_hz)
        return pcm

    # -- both -------------------------------------------------------------------------

    def finish_reason(self) -> str:
        finished = self.answer.finished
        if finished is not None and finished.finish_reason is not None:
            return finished.finish_reason
        return "tool_calls" if self.answer.calls else "stop"

    def usage(self) -> dict[str, int]:
        finished = self.answer.finished or Finished(None, None, None)
        prompt_tokens = finished.prompt_tokens or 0
        completion_tokens = finished.completion_tokens
        if completion_tokens is None:
            completion_tokens = self.answer.num_text_deltas
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return self._data({"choices": [choice]})

    def _data(self, fields: dict[str, Any]) -> bytes:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            **fields,
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    def _audio_chunk(self, data: bytes) -> bytes:
        return self._chunk(
            {"audio": {"id": self.audio_id, "data": base64.b64encode(data).decode()}}
        )
