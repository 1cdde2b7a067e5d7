"""server_vad through the real server, with a stand-in turn detector (no models):
any chunk with a loud sample is speech. The wiring under test is the server's:
detector streams per session, auto commit and response, barge-in, failures."""

from __future__ import annotations

import base64
import json
import re
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio
import trio_websocket

import omnitrio
from omnitrio import Event, Request, StreamOutput, StreamWork, VisibleItem
from omnitrio.server import ServerSettings, serve

RATE_HZ = 24000
CHUNK_SAMPLES = 2400  # 100 ms
LOUD = (8000).to_bytes(2, "little", signed=True) * CHUNK_SAMPLES
QUIET = bytes(2 * CHUNK_SAMPLES)


class LoudnessDetector:
    """Speech starts at a loud chunk and stops after ``quiet_chunks`` quiet ones; with
    ``pause_chunks``, that many quiet ones are a pause (speech_paused / speech_resumed)."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 0
    max_visible_per_step = 8

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        quiet_chunks: int = 2,
        pause_chunks: int | None = None,
    ) -> None:
        self.quiet_chunks = quiet_chunks
        self.pause_chunks = pause_chunks
        self._state: dict[str, list[int]] = {}  # [ms heard, in speech, quiet run, speech end]

    def open_stream(self, stream_id: str, request: Request) -> None:
        self._state[stream_id] = [0, 0, 0, 0]

    def close_stream(self, stream_id: str) -> None:
        del self._state[stream_id]

    def close(self) -> None:
        self._state.clear()

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        return {work.stream_id: self._one(work) for work in batch}

    def _one(self, work: StreamWork) -> StreamOutput:
        state = self._state[work.stream_id]
        events: list[VisibleItem] = []
        for chunk in work.inputs:
            assert isinstance(chunk, bytes)
            state[0] += len(chunk) // 2 * 1000 // RATE_HZ
            loud = chunk.count(LOUD[:2]) > 0
            if loud and not state[1]:
                events.append(Event("speech_started", {"audio_start_ms": state[0] - 100}))
            if loud and state[1] and self.pause_chunks and state[2] >= self.pause_chunks:
                events.append(Event("speech_resumed", {}))
            if loud:
                state[1], state[2], state[3] = 1, 0, state[0]
            elif state[1]:
                state[2] += 1
                if state[2] == self.pause_chunks:
                    events.append(Event("speech_paused", {"audio_end_ms": state[3]}))
                if state[2] >= self.quiet_chunks:
                    state[1] = 0
                    events.append(Event("speech_stopped", {"audio_end_ms": state[3]}))
        return StreamOutput(visible=tuple(events))


class BrokenDetector(LoudnessDetector):
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        raise RuntimeError("detector broke on purpose")


def _config(
    detector: str, steps: int, params: Mapping[str, Any] | None = None
) -> omnitrio.PipelineConfig:
    return omnitrio.parse_config(
        {
            "pipeline": {"name": "turns", "max_streams": 4, "shutdown_timeout_s": 2.0},
            "side_stage": {
                "name": "vad",
                "impl": f"tests.server.test_server_turns:{detector}",
                "params": dict(params or {}),
            },
            "stages": [
                {
                    "name": "a",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"steps": steps, "service_time_ms": 2.0},
                },
                {
                    "name": "b",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"outputs_per_input": 0, "visible": "audio"},
                },
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
    )


async def _connect(
    nursery: trio.Nursery, detector: str, steps: int, params: Mapping[str, Any] | None = None
) -> str:
    binds = await nursery.start(serve, _config(detector, steps, params), ServerSettings(port=0))
    return str(binds[0]).replace("http://", "ws://") + "/v1/realtime"


async def _append(ws: trio_websocket.WebSocketConnection, *chunks: bytes) -> None:
    for chunk in chunks:
        audio = base64.b64encode(chunk).decode()
        await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


async def _until(ws: trio_websocket.WebSocketConnection, kind: str) -> list[dict[str, Any]]:
    """Events up to and including the first of type ``kind``."""
    seen: list[dict[str, Any]] = []
    with trio.fail_after(10):
        while True:
            seen.append(json.loads(await ws.get_message()))
            if seen[-1]["type"] == kind:
                return seen


async def test_a_detected_turn_is_committed_and_answered(nursery: trio.Nursery) -> None:
    url = await _connect(nursery, "LoudnessDetector", steps=4)
    async with trio_websocket.open_websocket_url(url) as ws:
        [created] = await _until(ws, "session.created")
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await _append(ws, QUIET, LOUD, LOUD, QUIET, QUIET)
        kinds = [e["type"] for e in await _until(ws, "response.done")]
    expected = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio.delta",
        "response.done",
    ]
    assert [k for k in kinds if k in expected] == expected[:4] + [expected[4]] * 4 + expected[5:]


async def test_speech_over_an_answer_cancels_it(nursery: trio.Nursery) -> None:
    url = await _connect(nursery, "LoudnessDetector", steps=100_000)
    async with trio_websocket.open_websocket_url(url) as ws:
        await _until(ws, "session.created")
        await _append(ws, LOUD, QUIET, QUIET)
        first = (await _until(ws, "response.output_audio.delta"))[-1]["response_id"]
        await _append(ws, LOUD)  # barge in
        seen = await _until(ws, "input_audio_buffer.speech_started")
        seen = await _until(ws, "response.done")
        assert seen[-1]["response"]["id"] == first
        assert seen[-1]["response"]["status"] == "cancelled"
        late = [e for e in seen if e["type"] == "response.output_audio.delta"]
        assert late == []  # nothing of the answer after speech_started
        await _append(ws, QUIET, QUIET)  # the new turn ends: it is answered
        seen = await _until(ws, "response.created")
        assert seen[-1]["response"]["id"] != first


async def _connect_pausing(nursery: trio.Nursery, steps: int) -> tuple[str, str]:
    """The Realtime URL and the metrics URL of a server whose detector reports pauses
    (at 200 ms of silence; the turn ends at 500 ms)."""
    params = {"quiet_chunks": 5, "pause_chunks": 2}
    url = await _connect(nursery, "LoudnessDetector", steps=steps, params=params)
    return url, url.replace("ws://", "http://").replace("/v1/realtime", "/metrics")


async def test_an_answer_started_at_a_pause_is_sent_once_the_turn_ends(
    nursery: trio.Nursery,
) -> None:
    url, metrics = await _connect_pausing(nursery, steps=4)
    async with trio_websocket.open_websocket_url(url) as ws:
        await _until(ws, "session.created")
        await _append(ws, LOUD, LOUD, QUIET, QUIET, QUIET)  # paused, not ended
        seen = await _handled(ws)
        await trio.sleep(0.2)  # the speculative answer runs meanwhile
        seen += await _handled(ws)
        assert [e["type"] for e in seen if e["type"] != "error"] == [
            "input_audio_buffer.speech_started"
        ]
        await _append(ws, QUIET, QUIET)  # the turn ends
        seen = await _until(ws, "response.done")
    kinds = [e["type"] for e in seen]
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    assert kinds.count("response.output_audio.delta") == 4
    assert seen[-1]["response"]["status"] == "completed"
    assert await trio.to_thread.run_sync(_streams, metrics) == {
        "streams.completed": 1,  # the speculation was the answer
        "streams.cancelled": 0,
        "speculative_answers.taken": 1,
        "speculative_answers.dropped": 0,
        "streams.refused_headroom": 0,
        "streams.shed": 0,
    }


async def test_an_answer_started_at_a_pause_is_dropped_when_speech_resumes(
    nursery: trio.Nursery,
) -> None:
    url, metrics = await _connect_pausing(nursery, steps=100_000)
    async with trio_websocket.open_websocket_url(url) as ws:
        await _until(ws, "session.created")
        await _append(ws, LOUD, QUIET, QUIET, QUIET)  # a pause: an answer starts unseen
        seen = await _handled(ws)
        await trio.sleep(0.2)
        await _append(ws, LOUD, QUIET, QUIET, QUIET, QUIET, QUIET)  # speech goes on, then ends
        seen += await _until(ws, "response.output_audio.delta")
        kinds = [e["type"] for e in seen if e["type"] != "error"]
        assert kinds[:3] == [  # one turn: the pause neither ended it nor answered it
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
        ]
        assert kinds.count("response.created") == 1
        streams = await trio.to_thread.run_sync(_streams, metrics)
        assert streams["speculative_answers.dropped"] == 1
        with trio.fail_after(5):  # the speculative stream is closed, in the background
            while streams["streams.cancelled"] != 1:
                await trio.sleep(0.01)
                streams = await trio.to_thread.run_sync(_streams, metrics)


async def test_a_cancelled_speculative_answer_is_freed_before_response_done(
    nursery: trio.Nursery,
) -> None:
    url, metrics = await _connect_pausing(nursery, steps=100_000)
    async with trio_websocket.open_websocket_url(url) as ws:
        await _until(ws, "session.created")
        await _append(ws, LOUD, QUIET, QUIET, QUIET)  # a pause: an answer starts unseen
        await _handled(ws)
        await _append(ws, QUIET, QUIET)  # the turn ends: the response takes it over
        await _until(ws, "response.output_audio.delta")
        await ws.send_message(json.dumps({"type": "response.cancel"}))
        done = (await _until(ws, "response.done"))[-1]
        assert done["response"]["status"] == "cancelled"
        streams = await trio.to_thread.run_sync(_streams, metrics)
        assert streams["speculative_answers.taken"] == 1
        assert streams["streams.cancelled"] == 1  # released before response.done went out


async def test_a_failing_detector_turns_detection_off_with_an_error(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    url = await _connect(nursery, "BrokenDetector", steps=2)
    async with trio_websocket.open_websocket_url(url) as ws:
        await _until(ws, "session.created")
        await _append(ws, LOUD)
        error = (await _until(ws, "error"))[-1]["error"]
        assert error["code"] == "turn_detection_failed"
        assert "RuntimeError" not in error["message"]  # internals stay in the log
        updated = (await _until(ws, "session.updated"))[-1]
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        # Manual turns still work.
        await ws.send_message(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send_message(json.dumps({"type": "response.create"}))
        done = (await _until(ws, "response.done"))[-1]
        assert done["response"]["status"] == "completed"
    assert "detector broke on purpose" in caplog.text


async def test_switching_detection_off_frees_the_detector_stream(nursery: trio.Nursery) -> None:
    url = await _connect(nursery, "LoudnessDetector", steps=2)
    metrics = url.replace("ws://", "http://").replace("/v1/realtime", "/metrics")
    async with trio_websocket.open_websocket_url(url) as ws:
        await _until(ws, "session.created")
        await _append(ws, QUIET)
        await _handled(ws)
        assert await trio.to_thread.run_sync(_detector_streams, metrics) == 1
        off = {"audio": {"input": {"turn_detection": None}}}
        await ws.send_message(json.dumps({"type": "session.update", "session": off}))
        await _handled(ws)
        assert await trio.to_thread.run_sync(_detector_streams, metrics) == 0
    assert await trio.to_thread.run_sync(_detector_streams, metrics) == 0


async def _handled(ws: trio_websocket.WebSocketConnection) -> list[dict[str, Any]]:
    """Events until the server has handled everything sent so far (it answers in order)."""
    await ws.send_message(json.dumps({"type": "no.such.event"}))
    return await _until(ws, "error")


def _streams(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    found = re.findall(
        r'^omnitrio_(streams|speculative_answers)_total\{outcome="(\w+)"\} (\S+)$',
        text,
        re.MULTILINE,
    )
    return {f"{what}.{k}": float(v) for what, k, v in found if k not in ("refused", "failed")}


def _detector_streams(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^omnitrio_side_stage_streams (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))
