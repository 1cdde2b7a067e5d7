"""The offline voice chat (configs/voice-chat.yaml) through the Realtime WebSocket API,
with server_vad turn detection: spoken questions in, spoken answers out.

Questions are spoken by espeak-ng here in the test; answers are checked by a
separate instance of the ASR stage (the answer audio must say the answer text).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from omnitrio.server import ServerSettings, serve
from tests.voice_support import (
    INPUT_RATE_HZ,
    MAX_WER,
    VOICE_CONFIG,
    needs_voice,
    spoken,
    transcribe_pcm16,
    word_error_rate,
)

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

CHUNK_S = 0.1
TURN_TIMEOUT_S = 120.0  # generous: CI machines are shared and slow
QUESTION = "What do cats like to eat?"


@dataclass
class Turn:
    """What one conversation saw, event by event, up to a response.done."""

    types: list[str] = field(default_factory=list)
    user_transcript: str = ""
    answer_text: str = ""
    audio: bytes = b""
    status: str = ""
    response_ids: list[str] = field(default_factory=list)


async def _serve(nursery: trio.Nursery) -> str:
    import onnxruntime

    # Piper samples noise inside its model; its session's generator is seeded from
    # onnxruntime's global seed when the TTS stage loads, so one seed makes a run's
    # answer audio the same every time (unseeded, a word could blur: "cats" heard as
    # "cat's" one run in a few).
    onnxruntime.set_seed(0)
    binds = await nursery.start(serve, VOICE_CONFIG, ServerSettings(port=0))
    return str(binds[0]).replace("http://", "ws://") + "/v1/realtime"


async def _send_audio(ws: trio_websocket.WebSocketConnection, pcm16: bytes) -> None:
    chunk = int(CHUNK_S * INPUT_RATE_HZ) * 2
    for start in range(0, len(pcm16), chunk):
        audio = base64.b64encode(pcm16[start : start + chunk]).decode()
        await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


async def _next(ws: trio_websocket.WebSocketConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await ws.get_message())
    assert event["type"] != "error", event
    return event


async def _until_done(ws: trio_websocket.WebSocketConnection, turn: Turn) -> Turn:
    with trio.fail_after(TURN_TIMEOUT_S):
        while True:
            event = await _next(ws)
            kind = event["type"]
            turn.types.append(kind)
            if kind == "conversation.item.input_audio_transcription.completed":
                turn.user_transcript = event["transcript"]
            elif kind == "response.created":
                turn.response_ids.append(event["response"]["id"])
            elif kind == "response.output_audio.delta":
                turn.audio += base64.b64decode(event["delta"])
            elif kind == "response.output_audio_transcript.delta":
                turn.answer_text += event["delta"]
            elif kind == "response.done":
                turn.status = event["response"]["status"]
                return turn


async def _ask(url: str, question: str, tmp_path: Path) -> Turn:
    """One spoken turn: the question then silence; server_vad commits it and answers."""
    pcm16 = spoken(question, tmp_path / f"{abs(hash(question))}.wav", silence_after_s=1.5)
    async with trio_websocket.open_websocket_url(url, max_message_size=16 << 20) as ws:
        created = await _next(ws)
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await _send_audio(ws, pcm16)
        return await _until_done(ws, Turn())


@needs_voice
async def test_spoken_round_trip_matches_the_answer_text(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    url = await _serve(nursery)
    turn = await _ask(url, QUESTION, tmp_path)

    # server_vad found the turn, committed it and answered without being asked.
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio.delta",
        "response.done",
    ]
    positions = [turn.types.index(kind) for kind in order]
    assert positions == sorted(positions), turn.types
    assert turn.status == "completed"
    assert word_error_rate(QUESTION, turn.user_transcript) <= MAX_WER, turn.types

    # The answer's audio says the answer's text (checked by a separate ASR instance).
    assert turn.answer_text.strip()
    heard = await trio.to_thread.run_sync(transcribe_pcm16, turn.audio, INPUT_RATE_HZ)
    wer = word_error_rate(turn.answer_text, heard)
    assert wer <= MAX_WER, f"WER {wer:.2f}: said {turn.answer_text!r}, heard {heard!r}"


@needs_voice
async def test_two_conversations_each_get_their_own_answer(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    url = await _serve(nursery)
    questions = {"cats": QUESTION, "dragon": "Tell me a story about a dragon."}
    turns: dict[str, Turn] = {}

    async def converse(key: str) -> None:
        turns[key] = await _ask(url, questions[key], tmp_path)

    async with trio.open_nursery() as both:
        for key in questions:
            both.start_soon(converse, key)

    for key, turn in turns.items():
        assert turn.status == "completed", (key, turn.types)
        assert turn.audio, key
        assert key in turn.user_transcript.lower(), (key, turn.user_transcript)
    assert "cat" in turns["cats"].answer_text.lower()
    assert "dragon" in turns["dragon"].answer_text.lower()
    assert turns["cats"].answer_text != turns["dragon"].answer_text


@needs_voice
async def test_speech_over_an_answer_stops_it(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Barge-in: once speech_started goes out, the answer sends no more audio, its
    response ends cancelled, and the new turn is answered."""
    url = await _serve(nursery)
    story = spoken("Tell me a story about a dragon.", tmp_path / "story.wav", silence_after_s=1.5)
    question = spoken(QUESTION, tmp_path / "question.wav", silence_after_s=1.5)
    async with trio_websocket.open_websocket_url(url, max_message_size=16 << 20) as ws:
        assert (await _next(ws))["type"] == "session.created"
        await _send_audio(ws, story)
        with trio.fail_after(TURN_TIMEOUT_S):
            while (event := await _next(ws))["type"] != "response.output_audio.delta":
                pass
        first_response = event["response_id"]
        await _send_audio(ws, question)  # talk over the answer
        after_barge_in: list[dict[str, Any]] = []
        barged_in = False
        with trio.fail_after(TURN_TIMEOUT_S):
            while True:
                event = await _next(ws)
                barged_in |= event["type"] == "input_audio_buffer.speech_started"
                if barged_in:
                    after_barge_in.append(event)
                if event["type"] == "response.done" and event["response"]["id"] != first_response:
                    break
    late_audio = [
        e
        for e in after_barge_in
        if e["type"] == "response.output_audio.delta" and e["response_id"] == first_response
    ]
    assert late_audio == []
    done = [e for e in after_barge_in if e["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["cancelled", "completed"]
    assert done[0]["response"]["id"] == first_response


@needs_voice
async def test_response_cancel_frees_the_answer_before_response_done(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """response.cancel mid-answer: response.done says cancelled, every stage has already
    let go of the stream (it is released before response.done goes out), and no audio
    follows."""
    url = await _serve(nursery)
    metrics = url.replace("ws://", "http://").replace("/v1/realtime", "/metrics")
    story = spoken("Tell me a story about a dragon.", tmp_path / "story.wav", silence_after_s=1.5)
    async with trio_websocket.open_websocket_url(url, max_message_size=16 << 20) as ws:
        assert (await _next(ws))["type"] == "session.created"
        await _send_audio(ws, story)
        with trio.fail_after(TURN_TIMEOUT_S):
            while (await _next(ws))["type"] != "response.output_audio.delta":
                pass
            await ws.send_message(json.dumps({"type": "response.cancel"}))
            while (event := await _next(ws))["type"] != "response.done":
                pass
        assert event["response"]["status"] == "cancelled"
        open_streams = await trio.to_thread.run_sync(_open_streams, metrics)
        assert open_streams == 0
        with trio.move_on_after(1.0):
            late = await _next(ws)
            raise AssertionError(f"{late['type']} after response.done")


def _open_streams(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^omnitrio_open_streams (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


@needs_voice
async def test_the_speech_endpoint_reads_the_text_aloud(nursery: trio.Nursery) -> None:
    """/v1/audio/speech on the voice pipeline says its input (it does not answer it)."""
    url = await _serve(nursery)
    speech_url = url.replace("ws://", "http://").replace("/v1/realtime", "/v1/audio/speech")
    text = "Cats are small furry animals that like to sleep a lot."

    def post() -> bytes:
        body = json.dumps({"model": "voice-chat", "input": text, "response_format": "pcm"})
        request = urllib.request.Request(
            speech_url, body.encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=TURN_TIMEOUT_S) as response:
            return bytes(response.read())

    pcm16 = await trio.to_thread.run_sync(post)
    heard = await trio.to_thread.run_sync(transcribe_pcm16, pcm16, INPUT_RATE_HZ)
    assert word_error_rate(text, heard) <= MAX_WER, heard
