"""Targets that drive a running omnitrio server: Realtime WebSocket and chat completions SSE.

Each request is one connection. Over the Realtime API a request is a session
with one user message and one ``response.create``; times count from sending
``response.create`` (the connection set-up is left out). Over chat completions
a request is one streamed POST; times count from sending it. The server's
``/metrics`` is sampled for queue depths, batch sizes, open streams and memory.
"""

from __future__ import annotations

import base64
import json
import re
from contextlib import aclosing
from typing import Any

import msgpack  # type: ignore[import-untyped]
import trio

from ._http import Endpoint, get_text, http_request, sse_events
from ._target import Prompt, Refused, Sample, TargetError, Timeline

_METRIC_LINE = re.compile(r'^(\w+)(?:\{stage="([^"]*)"\})?\s+(\S+)$')
MSGPACK_SUBPROTOCOL = "omnitrio.msgpack.v1"
_OVERLOADED = "max_streams"  # in the message of a refusal (omnitrio.Overloaded)
_RETRY_IN_CLOSE = re.compile(r"retry after (\d+) ms")  # a full server's 1013 reason


def _refused_session(event: dict[str, Any]) -> Exception:
    """A session's first event, an ``error``: ``Refused`` with its hint where it is a
    full server's (``retry_after_ms``), else ``TargetError``."""
    error = event.get("error") or {}
    message = str(error.get("message", "error"))
    if error.get("code") != "server_overloaded":
        return TargetError(f"error event: {message}")
    retry_ms = error.get("retry_after_ms")
    return Refused(message, retry_ms / 1000 if isinstance(retry_ms, int | float) else None)


def parse_metrics(text: str) -> Sample:
    """The parts of omnitrio's Prometheus text the benchmark samples."""
    depth: dict[str, int] = {}
    batch: dict[str, float] = {}
    open_streams: int | None = None
    rss: int | None = None
    for line in text.splitlines():
        match = _METRIC_LINE.match(line)
        if not match:
            continue
        name, stage, value = match.group(1), match.group(2), float(match.group(3))
        if name == "omnitrio_stage_queue_depth" and stage is not None:
            depth[stage] = int(value)
        elif name == "omnitrio_stage_last_batch_size" and stage is not None:
            batch[stage] = value
        elif name == "omnitrio_open_streams":
            open_streams = int(value)
        elif name == "process_resident_memory_bytes":
            rss = int(value)
    return Sample(0.0, open_streams, depth, batch, rss)


class _ServerTarget:
    def __init__(self, endpoint: Endpoint, name: str) -> None:
        self.name = name
        self._endpoint = endpoint

    async def sample(self) -> Sample | None:
        try:
            status, text = await get_text(self._endpoint, "/metrics")
        except OSError:
            return None  # the server is gone; the requests will say so
        return parse_metrics(text) if status == 200 else None


class ChatTarget(_ServerTarget):
    """``POST /v1/chat/completions`` with ``stream: true`` and audio output."""

    def __init__(self, endpoint: Endpoint, name: str = "omnitrio-chat-sse") -> None:
        super().__init__(endpoint, name)

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        body = json.dumps(
            {
                "model": "bench",
                "messages": [{"role": "user", "content": prompt.text}],
                "modalities": ["text", "audio"],
                "audio": {"voice": "default", "format": "pcm16"},
                "max_tokens": prompt.output_len,
                "stream": True,
            }
        ).encode()
        rate_hz = 24000  # the server's output_sample_rate_hz default; chat has no field for it
        timeline.restart()
        try:
            async with http_request(
                self._endpoint, "POST", "/v1/chat/completions", body, "application/json"
            ) as response:
                if response.status == 503:  # honoured as the in-process client does
                    raise Refused("HTTP 503", response.retry_after_s)
                if response.status != 200:
                    raise TargetError(f"HTTP {response.status}")
                async with aclosing(sse_events(response.body)) as events:
                    async for data in events:
                        if data == "[DONE]":
                            return
                        await timeline.consume(_chat_chunk(json.loads(data), timeline, rate_hz))
        except OSError as exc:
            raise TargetError(f"connection failed: {exc}") from exc
        raise TargetError("the stream ended without [DONE]")


def _chat_chunk(chunk: dict[str, Any], timeline: Timeline, rate_hz: int) -> float:
    """Record one SSE chunk; returns the seconds of audio it carried."""
    if "error" in chunk:
        raise TargetError(str(chunk["error"].get("message", chunk["error"])))
    delta = chunk["choices"][0]["delta"]
    if delta.get("content"):
        timeline.text()
    audio = delta.get("audio") or {}
    if audio.get("transcript"):
        timeline.text()
    if not audio.get("data"):
        return 0.0
    duration_s = len(base64.b64decode(audio["data"])) / 2 / rate_hz
    timeline.audio_chunk(duration_s)
    return duration_s


class RealtimeTarget(_ServerTarget):
    """``/v1/realtime`` over trio-websocket, JSON or msgpack framing (GA event names)."""

    def __init__(self, endpoint: Endpoint, framing: str) -> None:
        super().__init__(endpoint, f"omnitrio-realtime-{framing}")
        self._msgpack = framing == "msgpack"

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

        subprotocols = [MSGPACK_SUBPROTOCOL] if self._msgpack else []
        try:
            async with open_websocket_url(
                self._endpoint.ws_url("/v1/realtime"), subprotocols=subprotocols
            ) as ws:
                created = self._decode(await ws.get_message())
                if created.get("type") == "error":  # a full server: this, then 1013
                    raise _refused_session(created)
                rate_hz = int(created["session"]["audio"]["output"]["format"]["rate"])
                item = {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": prompt.text}],
                }
                await ws.send_message(
                    self._encode({"type": "conversation.item.create", "item": item})
                )
                response = {"output_modalities": ["audio"], "max_output_tokens": prompt.output_len}
                timeline.restart()
                await ws.send_message(
                    self._encode({"type": "response.create", "response": response})
                )
                while True:
                    event = self._decode(await ws.get_message())
                    if self._on_event(event, timeline, rate_hz):
                        return
                    if timeline.audio and event.get("type") == "response.output_audio.delta":
                        await timeline.consume(timeline.audio[-1].duration_s)
        except ConnectionClosed as exc:
            if exc.reason is not None and exc.reason.code == 1013:
                hint = _RETRY_IN_CLOSE.search(exc.reason.reason or "")
                retry_s = None if hint is None else int(hint.group(1)) / 1000
                raise Refused("close 1013", retry_s) from exc
            raise TargetError(f"connection closed: {exc.reason}") from exc
        except (HandshakeError, OSError) as exc:
            raise TargetError(f"cannot connect: {exc}") from exc

    def _on_event(self, event: dict[str, Any], timeline: Timeline, rate_hz: int) -> bool:
        kind = event.get("type")
        if kind == "response.output_audio.delta":
            delta = event["delta"]
            pcm = delta if isinstance(delta, bytes) else base64.b64decode(delta)
            timeline.audio_chunk(len(pcm) / 2 / rate_hz)
        elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            timeline.text()
        elif kind == "error":
            raise TargetError(f"error event: {event.get('error', {}).get('message')}")
        elif kind == "response.done":
            status = event["response"]["status"]
            if status == "completed":
                return True
            details = event["response"].get("status_details") or {}
            error = details.get("error") or {}
            message = str(error.get("message", status))
            if _OVERLOADED in message:
                retry_ms = error.get("retry_after_ms")
                hint = retry_ms / 1000 if isinstance(retry_ms, int | float) else None
                raise Refused(message, hint)
            raise TargetError(f"response {status}: {message}")
        return False

    def _encode(self, event: dict[str, Any]) -> str | bytes:
        return msgpack.packb(event) if self._msgpack else json.dumps(event)

    def _decode(self, frame: str | bytes) -> dict[str, Any]:
        value = msgpack.unpackb(frame) if isinstance(frame, bytes) else json.loads(frame)
        if not isinstance(value, dict):
            raise TargetError(f"server sent a {type(value).__name__}, not an event object")
        return value


async def wait_until_serving(endpoint: Endpoint, timeout_s: float) -> None:
    """Return once ``/health`` answers 200; raise ``ConnectionError`` otherwise."""
    where = f"{endpoint.host}:{endpoint.port}"
    status: int | None = None
    with trio.move_on_after(timeout_s):
        try:
            status, _ = await get_text(endpoint, "/health")
        except OSError as exc:
            raise ConnectionError(f"no omnitrio server at {where} ({exc})") from exc
    if status != 200:
        raise ConnectionError(f"the server at {where} is not healthy (GET /health: {status})")
