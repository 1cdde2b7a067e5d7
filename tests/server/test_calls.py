"""WebRTC calls (``POST /v1/realtime/calls``) against a real server, with a real aiortc
peer that posts its offer through the official ``openai`` SDK (tests/webrtc_support.py).
The pipeline is synthetic here (its audio is a tone); tests/webrtc/ speaks to the voice
chat."""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import trio

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config
from tests.webrtc_support import RATE_HZ, Caller, run_caller

SPEAKING = [
    {"steps": 6, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 1600},
]
TEXT_TURN = {
    "type": "conversation.item.create",
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
}
TURN_TIMEOUT_S = 20.0


async def _server(
    nursery: trio.Nursery, stages: list[dict[str, object]], **settings: object
) -> str:
    config = chain_config(stages, max_streams=4)
    binds = await nursery.start(serve, config, ServerSettings(port=0, **settings))  # type: ignore[arg-type]
    return str(binds[0])


def _post(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, body, {"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def test_a_text_turn_is_heard_on_the_track(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING)

    async def script() -> tuple[list[str], bytes]:
        caller = Caller(base_url)
        try:
            await caller.connect()
            await caller.wait_type("session.created", TURN_TIMEOUT_S)
            caller.send(TEXT_TURN)
            caller.send({"type": "response.create"})
            await caller.wait_type("response.done", TURN_TIMEOUT_S)
            await caller.wait_type("output_audio_buffer.stopped", TURN_TIMEOUT_S)
            return caller.types(), bytes(caller.audio)
        finally:
            await caller.close()

    types, audio = await trio.to_thread.run_sync(run_caller, script)
    assert "output_audio_buffer.started" in types
    assert "response.output_audio.delta" not in types  # the audio went on the track
    assert "response.output_audio.done" in types
    samples = np.frombuffer(audio, "<i2")
    loud = np.abs(samples) > 200
    assert loud.sum() / RATE_HZ > 0.3, "the answer's audio did not come on the track"


async def test_garbage_and_offers_without_audio_are_refused(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING)
    url = f"{base_url}/v1/realtime/calls"
    status, body = await trio.to_thread.run_sync(_post, url, b"hello there", "application/sdp")
    assert (status, b"invalid_offer" in body) == (400, True), body
    no_audio = (
        b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
        b"m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
    )
    status, body = await trio.to_thread.run_sync(_post, url, no_audio, "application/sdp")
    assert (status, b"offer_without_audio" in body) == (400, True), body
    status, body = await trio.to_thread.run_sync(_post, url, b"{}", "application/json")
    assert (status, b"invalid_content_type" in body) == (400, True), body
