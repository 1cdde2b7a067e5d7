"""The voice chat (configs/voice-chat.yaml) over WebRTC, end to end with real peers.

An aiortc caller (tests/webrtc_support.py) posts its offer with the official ``openai``
SDK, speaks a question (the Piper voice, made here) into its microphone track, and
hears the answer on the remote track; server VAD finds the turn. The answer's audio is
transcribed by a separate ASR instance and must say the answer's text.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from omnitrio.server import ServerSettings, serve
from tests.voice_support import (
    MAX_WER,
    VOICE_CONFIG,
    needs_voice,
    spoken,
    transcribe_pcm16,
    word_error_rate,
)
from tests.webrtc_support import RATE_HZ, Caller, run_caller

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

QUESTION = "What do cats like to eat?"
STORY = "Tell me a story about a dragon."
TURN_TIMEOUT_S = 120.0
SILENT_WITHIN_S = 0.2  # barge-in: the track goes quiet this soon after the cut
RELEASED_WITHIN_S = 2.0


async def _serve(nursery: trio.Nursery) -> str:
    import onnxruntime

    onnxruntime.set_seed(0)  # Piper's sampled noise, as in test_voice_realtime.py
    binds = await nursery.start(serve, VOICE_CONFIG, ServerSettings(port=0))
    return str(binds[0])


def _metric(base_url: str, name: str) -> float:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    return float(match.group(1))


def _answer_text(events: list[dict[str, Any]], response_id: str) -> str:
    return "".join(
        e["delta"]
        for e in events
        if e["type"] == "response.output_audio_transcript.delta" and e["response_id"] == response_id
    )


async def test_a_spoken_question_is_answered_on_the_track(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    base_url = await _serve(nursery)
    question = spoken(QUESTION, tmp_path / "question.wav")

    async def script() -> tuple[list[dict[str, Any]], bytes]:
        caller = Caller(base_url)
        try:
            await caller.connect()
            created = await caller.wait_type("session.created", TURN_TIMEOUT_S)
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            caller.mic.say(question)
            await caller.wait_type("response.done", TURN_TIMEOUT_S)
            await caller.wait_type("output_audio_buffer.stopped", TURN_TIMEOUT_S)
            return caller.events, bytes(caller.audio)
        finally:
            await caller.close()

    events, audio = await trio.to_thread.run_sync(run_caller, script)
    types = [e["type"] for e in events]
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "output_audio_buffer.started",
        "response.done",
        "output_audio_buffer.stopped",
    ]
    positions = [types.index(kind) for kind in order]
    assert positions == sorted(positions), types
    assert "response.output_audio.delta" not in types
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    heard_question = next(
        e["transcript"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    )
    assert word_error_rate(QUESTION, heard_question) <= MAX_WER, heard_question
    answer = _answer_text(events, done["response"]["id"])
    assert answer.strip()
    heard = await trio.to_thread.run_sync(transcribe_pcm16, audio, RATE_HZ)
    wer = word_error_rate(answer, heard)
    assert wer <= MAX_WER, f"WER {wer:.2f}: said {answer!r}, heard {heard!r}"


async def test_talking_over_the_answer_cuts_the_track(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Barge-in: the track goes quiet at once, output_audio_buffer.cleared and
    conversation.item.truncated say how much was played, and the new turn is answered."""
    base_url = await _serve(nursery)
    story = spoken(STORY, tmp_path / "story.wav")
    question = spoken(QUESTION, tmp_path / "question.wav")

    async def script() -> tuple[Caller, float]:
        caller = Caller(base_url)
        try:
            await caller.connect()
            await caller.wait_type("session.created", TURN_TIMEOUT_S)
            caller.mic.say(story)
            started = await caller.wait_type("output_audio_buffer.started", TURN_TIMEOUT_S)
            await asyncio.sleep(1.5)
            said_at = caller.time_of(started)
            caller.mic.say(question)
            await caller.wait_type("output_audio_buffer.cleared", TURN_TIMEOUT_S)
            await caller.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["status"] == "completed",
                TURN_TIMEOUT_S,
            )
            return caller, said_at
        finally:
            await caller.close()

    caller, started_at = await trio.to_thread.run_sync(run_caller, script)
    events = caller.events
    cleared = next(e for e in events if e["type"] == "output_audio_buffer.cleared")
    truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
    played_s = truncated["audio_end_ms"] / 1000
    cut_at = caller.time_of(cleared)
    assert 1.0 <= played_s <= cut_at - started_at + 0.1, (played_s, cut_at - started_at)
    dones = [e["response"]["status"] for e in events if e["type"] == "response.done"]
    assert dones[0] == "cancelled", dones
    # Quiet from the cut until the question ends and the new answer starts (>= 1 s on).
    late = [t for t in caller.audio_times if cut_at + SILENT_WITHIN_S < t < cut_at + 1.0]
    assert late == [], f"{len(late)} frames of sound after the cut"


async def test_a_call_torn_down_mid_answer_frees_everything(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    base_url = await _serve(nursery)
    story = spoken(STORY, tmp_path / "story.wav")

    async def script() -> None:
        caller = Caller(base_url)
        await caller.connect()
        await caller.wait_type("session.created", TURN_TIMEOUT_S)
        caller.mic.say(story)
        await caller.wait_type("output_audio_buffer.started", TURN_TIMEOUT_S)
        await caller.close()  # the caller hangs up mid-answer

    await trio.to_thread.run_sync(run_caller, script)
    gone_at = trio.current_time()
    with trio.fail_after(RELEASED_WITHIN_S):
        while await _up(base_url):  # noqa: ASYNC110 (metrics: nothing to wait on)
            await trio.sleep(0.05)
    assert trio.current_time() - gone_at < RELEASED_WITHIN_S
    assert await trio.to_thread.run_sync(_metric, base_url, "omnitrio_webrtc_calls_total") == 1


async def _up(base_url: str) -> float:
    """Calls up plus pipeline streams open (read off the loop the server runs on)."""
    calls = await trio.to_thread.run_sync(_metric, base_url, "omnitrio_webrtc_calls_up")
    streams = await trio.to_thread.run_sync(_metric, base_url, "omnitrio_open_streams")
    return calls + streams
