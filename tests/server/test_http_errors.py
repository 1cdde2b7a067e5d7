"""The HTTP API's one admission check (``omnitrio/server/_http_errors.py``'s ``admit``):
asked for the kind of request it is, not as if every request played audio; the answer
to a refusal that comes after it (``failure``): the pipeline's own; and a Realtime
session's look at connect (``ServerState.session_busy``), whose responses are each
admitted by their kind; a draining server's refusal."""

from __future__ import annotations

import pickle
import re
import threading
import time
from typing import Any

import httpx
import openai
import pytest
import trio
from prometheus_client import generate_latest

from omnitrio import open_pipeline
from omnitrio.admission import _rule
from omnitrio.server import ServerSettings, serve
from omnitrio.server._api_errors import busy_error
from omnitrio.server._audio import wav_bytes
from omnitrio.server._state import SESSION_LOOK, ServerState
from stages.synthetic import SyntheticStage
from tests.conftest import SYNTHETIC, chain_config


class Transcriber(SyntheticStage):
    """The synthetic stage, declaring that it transcribes: the server then serves
    /v1/audio/transcriptions (``_capabilities.py``)."""

    tasks = ("transcribe",)


# a: every stream's first step sleeps 1.5 s (a prompt's prefill), so a stream's way to
# its first audio takes that; b says 20 ms of audio per input, text for a transcription.
STAGES = [
    {"steps": 10, "visible_every": 0, "prefill_ms": 1500.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320, "service_time_ms": 1.0},
]


SPEECH = {"model": "m", "input": "hello", "voice": "alloy", "response_format": "pcm"}
UPLOAD = {"file": ("one.wav", wav_bytes(b"\x00\x00" * 16000, 16000))}


def _post(base: str, path: str, **kwargs: Any) -> int:
    return httpx.post(f"{base}{path}", timeout=30, **kwargs).status_code


def _open_streams(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    match = re.search(r"^omnitrio_open_streams (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


async def _serve_cpu(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, stages: list[Any], cores: float
) -> str:
    """A server on the synthetic chain under ``admission: cpu`` with a 0.3 s wait, on
    ``cores`` cores: its base URL."""
    monkeypatch.setattr(_rule, "usable_cores", lambda: cores)
    config = chain_config(stages, impls=[SYNTHETIC, f"{__name__}:Transcriber"])
    update = {"admission": "cpu", "admission_wait_s": 0.3}
    config = config.model_copy(update={"pipeline": config.pipeline.model_copy(update=update)})
    (base, *_) = await nursery.start(serve, config, ServerSettings(port=0))
    return str(base)


def _one_starting(base: str) -> tuple[threading.Thread, list[int]]:
    """One speech completes (a startup of ~1.5 s learned), then another is on its way
    to its first audio (admitted, in its prefill) when this returns: its thread, and
    the list its status lands in."""
    assert _post(base, "/v1/audio/speech", json=SPEECH) == 200
    starting: list[int] = []
    first = threading.Thread(
        target=lambda: starting.append(_post(base, "/v1/audio/speech", json=SPEECH))
    )
    first.start()
    deadline = time.monotonic() + 10.0
    while _open_streams(base) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return first, starting


async def test_a_transcription_is_admitted_while_a_startup_holds_the_audio_streams(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # admission: cpu with a wait: a new stream that plays audio is held while another is
    # on its way to its first audio (the startup hold), here for longer than its wait:
    # refused at once, 503. A transcription plays no audio and is not held: the rule
    # admits it, so the look before it opens must too (it asked for an audio stream,
    # and refused the transcription with the speech).
    base = await _serve_cpu(nursery, monkeypatch, STAGES, cores=64.0)  # the cores never refuse

    def run() -> tuple[int, int, int]:
        first, starting = _one_starting(base)
        held = _post(base, "/v1/audio/speech", json=SPEECH)
        transcribed = _post(base, "/v1/audio/transcriptions", files=UPLOAD, data={"model": "m"})
        first.join()
        return starting[0], held, transcribed

    starting, held, transcribed = await trio.to_thread.run_sync(run)
    assert starting == 200
    assert held == 503  # speech: held by the startup hold past its wait, at once
    assert transcribed == 200


# a: a long answer (1000 steps of 10 ms, 20 ms of audio each: twice real time) that
# plays while another request looks and waits.
LONG_STAGES = [
    {"steps": 1000, "visible_every": 0, "service_time_ms": 10.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320, "service_time_ms": 1.0},
]


async def test_a_refusal_after_the_look_answers_with_the_pipelines_own_refusal(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # admission: cpu on cores far too few for two streams, with a wait: once the answer
    # playing has cost the cores its CPU seconds, the rule refuses a transcription beside
    # it, with no retry hint yet (no stream completed), so the look lets it through (it
    # may wait); its wait runs out in open_stream, which raises the pipeline's refusal
    # for a transcription. The 503 says that refusal (the transcription beside the audio
    # stream), not a fresh one asked as if it played audio ("with 2 streams playing").
    base = await _serve_cpu(nursery, monkeypatch, LONG_STAGES, cores=0.001)

    def run() -> tuple[httpx.Response, str]:
        with httpx.stream("POST", f"{base}/v1/audio/speech", json=SPEECH, timeout=30) as playing:
            assert playing.status_code == 200
            rate_hz = int(playing.headers["X-Sample-Rate"])
            chunks = playing.iter_bytes()  # kept open (a loop left by break closes it)
            received = 0
            while received < 2 * rate_hz * 2:  # 2 s of PCM16: its CPU cost is known
                received += len(next(chunks))
            refused = httpx.post(
                f"{base}/v1/audio/transcriptions", files=UPLOAD, data={"model": "m"}, timeout=30
            )
        return refused, httpx.get(f"{base}/metrics", timeout=10).text

    refused, metrics = await trio.to_thread.run_sync(run)
    assert refused.status_code == 503
    message = refused.json()["error"]["message"]
    assert "with 1 streams playing audio beside 1 playing none" in message, message
    assert refused.headers["Retry-After"] == "1"  # the pipeline has no estimate yet
    assert re.search(r'^omnitrio_admission_waits_total\{outcome="refused"\} 1', metrics, re.M)


async def test_a_realtime_session_connects_while_a_startup_holds_the_audio_streams(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in the first test, while one speech is on its way to its first audio a new
    # audio stream would be refused at once. The session's look at connect asked as for
    # one that plays audio, and refused the session (an error event, then 1013), though
    # a text response on it is admitted: now it connects, and its text response runs
    # (the synthetic stage's audio is not sent on a text response: it ends with none).
    base = await _serve_cpu(nursery, monkeypatch, STAGES, cores=64.0)

    def run() -> tuple[int, int, str | None, list[str]]:
        first, starting = _one_starting(base)
        held = _post(base, "/v1/audio/speech", json=SPEECH)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        with client.realtime.connect(model="m") as conn:
            created = conn.recv()
            assert created.type == "session.created", created
            conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            assert conn.recv().type == "session.updated"
            content = [{"type": "input_text", "text": "hello"}]
            conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": content}
            )
            conn.response.create()
            types, status = [], None
            for event in conn:
                types.append(event.type)
                if event.type == "response.done":
                    status = event.response.status
                    break
        first.join()
        return starting[0], held, status, types

    with trio.fail_after(30):  # a response that never ends fails the test, not hangs it
        starting, held, status, types = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    assert (starting, held) == (200, 503)  # an audio stream is refused at once meanwhile
    assert status == "completed"  # admitted: a refused response ends "failed"
    assert "response.created" in types


async def test_a_draining_server_refuses_saying_so_not_naming_max_streams() -> None:
    """A draining server's refusal (``ServerState.refuse("draining")``, the 503 of the
    HTTP API, the Realtime session's error) says the server is draining: before, it
    said the pipeline served its ``max_streams`` (or gave the pipeline's own refusal when
    the pipeline was full too), which tells the client to retry here."""
    config = chain_config([{"steps": 1000, "service_time_ms": 5.0}], max_streams=1)
    async with open_pipeline(config) as pipeline, pipeline.open_stream("held"):
        state = ServerState(pipeline, ServerSettings(port=0))
        assert state.busy() == "overloaded"  # the one stream fills it
        state.draining = True
        assert state.busy() == "draining"
        for refusal in (state.refuse("draining"), state.refuse("draining", SESSION_LOOK)):
            assert str(pickle.loads(pickle.dumps(refusal))) == str(refusal)
            error = busy_error(refusal)
            assert error.status == 503
            assert "the server is draining" in error.message
            assert "max_streams" not in error.message
        metrics = generate_latest(state.registry).decode()
        assert 'omnitrio_refusals_total{reason="draining"} 2.0' in metrics
