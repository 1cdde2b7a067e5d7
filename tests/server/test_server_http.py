"""The HTTP side of the server, driven by the official ``openai`` SDK and raw requests."""

from __future__ import annotations

import base64
import json
import math
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest
import trio

from omnitrio.server import ServerSettings, SettingsError, serve
from tests.conftest import chain_config

REPO = Path(__file__).resolve().parents[2]
SPEAKING = [
    {"steps": 6, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]


@pytest.fixture
async def base_url(nursery: trio.Nursery) -> str:
    """A server on a free loopback port, stopped with the test's nursery."""
    config = chain_config(SPEAKING, max_streams=4)
    binds = await nursery.start(serve, config, ServerSettings(port=0))
    return str(binds[0])


def _client(base_url: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


async def test_health_models_and_metrics(base_url: str) -> None:
    status, body, _ = await trio.to_thread.run_sync(_get, f"{base_url}/health")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    models = await trio.to_thread.run_sync(lambda: _client(base_url).models.list())
    assert [m.id for m in models.data] == ["test"]
    status, body, _ = await trio.to_thread.run_sync(_get, f"{base_url}/metrics")
    text = body.decode()
    assert status == 200
    for name in (
        "omnitrio_open_streams",
        'omnitrio_stage_queue_depth{stage="a"}',
        "omnitrio_time_to_first_audio_seconds_bucket",
        "omnitrio_refusals_total",
        'omnitrio_stage_steps_total{stage="a"}',
        'omnitrio_stage_busy_seconds_total{stage="a"}',
        'omnitrio_streams_total{outcome="completed"}',
        "# TYPE omnitrio_streams_total counter",
        "# TYPE omnitrio_stage_steps_total counter",
        "# TYPE omnitrio_stage_model_scale gauge",
        "# TYPE omnitrio_stage_model_first_step_share gauge",
        'omnitrio_admission_waits_total{outcome="left"} 0.0',  # admission_wait_s: _wait.py
        "omnitrio_admission_wait_seconds_total 0.0",
        "omnitrio_admission_waiting 0.0",
    ):
        assert name in text, name


async def test_metrics_count_the_steps_a_stream_waited_for_its_first_step(base_url: str) -> None:
    def scrape() -> dict[str, float]:
        status, body, _ = _get(f"{base_url}/metrics")
        assert status == 200
        prefix = "omnitrio_stage_max_steps_to_first_step{"
        return {
            line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in body.decode().splitlines()
            if line.startswith(prefix)
        }

    assert await trio.to_thread.run_sync(scrape) == {"a": 0.0, "b": 0.0}  # no stream yet
    await trio.to_thread.run_sync(
        lambda: _client(base_url).chat.completions.create(
            model="test", messages=[{"role": "user", "content": "hi"}]
        )
    )
    # One stream on an idle pipeline: at each stage it waited for its own first step
    # alone (StageStatistics.max_steps_to_first_step).
    assert await trio.to_thread.run_sync(scrape) == {"a": 1.0, "b": 1.0}


async def test_streaming_chat_completion_with_audio(base_url: str) -> None:
    def run() -> tuple[str, bytes]:
        stream = _client(base_url).chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "hello"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},
            stream=True,
        )
        transcript, audio = "", b""
        for chunk in stream:
            delta = chunk.choices[0].delta
            if delta.audio is not None:  # the SDK's own ChoiceDeltaAudio
                transcript += delta.audio.transcript or ""
                audio += base64.b64decode(delta.audio.data or "")
        return transcript, audio

    transcript, audio = await trio.to_thread.run_sync(run)
    assert transcript == "".join(f"a:{i} " for i in range(1, 7))
    # 6 chunks of 320 samples at 16 kHz, resampled to the session's 24 kHz.
    assert len(audio) == 6 * 480 * 2


async def test_text_only_and_non_streaming_chat_completions(base_url: str) -> None:
    def run() -> tuple[str, str, bytes]:
        client = _client(base_url)
        text = client.chat.completions.create(
            model="test", messages=[{"role": "user", "content": "hi"}]
        )
        audio = client.chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "hi"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )
        assert audio.choices[0].message.audio is not None
        message = audio.choices[0].message.audio
        return (
            text.choices[0].message.content or "",
            message.transcript,
            base64.b64decode(message.data),
        )

    text, transcript, wav = await trio.to_thread.run_sync(run)
    assert text == transcript == "".join(f"a:{i} " for i in range(1, 7))
    assert wav[:4] == b"RIFF"
    assert len(wav) == 44 + 6 * 480 * 2


async def test_speech_streams_pcm_and_wav(base_url: str) -> None:
    def run(fmt: str) -> bytes:
        response = _client(base_url).audio.speech.create(
            model="test",
            voice="alloy",
            input="hello",
            response_format=fmt,  # type: ignore[arg-type]
        )
        return response.read()

    pcm = await trio.to_thread.run_sync(run, "pcm")
    wav = await trio.to_thread.run_sync(run, "wav")
    assert len(pcm) == 6 * 480 * 2
    assert wav[:4] == b"RIFF"
    # The same audio after the 44-byte header: the same length, and samples equal to within
    # 1 % of the signal's peak (fresh-clone runs saw two requests' samples differ by 1-2
    # steps near the end: the streaming resampler's output depends on how the audio was
    # cut into chunks; the format, not the last bits of the signal, is what this tests).
    assert len(wav) - 44 == len(pcm)
    pcm_samples = np.frombuffer(pcm, "<i2").astype(int)
    peak = int(np.abs(pcm_samples).max())
    assert peak >= 100, "the speech is silent"
    difference = np.frombuffer(wav[44:], "<i2").astype(int) - pcm_samples
    assert int(np.abs(difference).max()) <= max(2, peak // 100)


async def test_bad_bodies_get_openai_style_400s(base_url: str) -> None:
    def post(body: bytes) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{base_url}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    for body, where in [
        (b"{not json", "body"),
        (b'{"model": "test", "messages": []}', "messages"),
        (b'{"model": "test", "messages": [{"role": "wizard", "content": "x"}]}', "messages.0.role"),
        (
            b'{"model": "test", "messages": [{"role": "user", "content": "x"}], '
            b'"modalities": ["audio"]}',
            "audio",
        ),
    ]:
        status, payload = await trio.to_thread.run_sync(post, body)
        assert status == 400, body
        assert payload["error"]["message"].startswith(where), payload
    status, _, _ = await trio.to_thread.run_sync(_get, f"{base_url}/health")
    assert status == 200  # still serving


async def test_api_key_and_origin(nursery: trio.Nursery) -> None:
    settings = ServerSettings(port=0, api_key="sekrit")
    (url, *_) = await nursery.start(serve, chain_config(SPEAKING), settings)
    status, _, _ = await trio.to_thread.run_sync(_get, f"{url}/v1/models")
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        await trio.to_thread.run_sync(lambda: _client(url, "wrong").models.list())
    models = await trio.to_thread.run_sync(lambda: _client(url, "sekrit").models.list())
    assert models.data
    evil = {"Authorization": "Bearer sekrit", "Origin": "http://evil.example"}
    status, _, _ = await trio.to_thread.run_sync(_get, f"{url}/v1/models", evil)
    assert status == 403
    status, _, _ = await trio.to_thread.run_sync(_get, f"{url}/health")
    assert status == 200  # health needs no key


def test_non_loopback_bind_needs_a_key() -> None:
    with pytest.raises(SettingsError, match="API key is required"):
        ServerSettings(host="0.0.0.0")
    ServerSettings(host="0.0.0.0", api_key="k")


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
@pytest.mark.parametrize(
    "name",
    ["grace_period_s", "send_timeout_s", "close_linger_s", "crowded_idle_s", "decode_timeout_s"],
)
def test_time_settings_must_be_positive_and_finite(name: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"{name} must be positive and finite"):
        ServerSettings(**{name: value})  # type: ignore[arg-type]


async def test_overload_is_an_immediate_503(nursery: trio.Nursery) -> None:
    config = chain_config([{"steps": 100_000}, {"outputs_per_input": 0}], max_streams=1)
    (url, *_) = await nursery.start(serve, config, ServerSettings(port=0))

    def hold_one_and_try_another() -> openai.APIStatusError | None:
        client = _client(url)
        held = client.chat.completions.create(
            model="test", messages=[{"role": "user", "content": "x"}], stream=True
        )
        next(iter(held))
        try:
            client.chat.completions.create(
                model="test", messages=[{"role": "user", "content": "y"}]
            )
        except openai.APIStatusError as exc:
            return exc
        finally:
            held.close()
        return None

    refused = await trio.to_thread.run_sync(hold_one_and_try_another)
    assert refused is not None
    assert refused.status_code == 503
    assert refused.response.headers["Retry-After"] == "1"


async def test_static_files_cannot_escape_web(base_url: str) -> None:
    for path in (
        "/static/../../pyproject.toml",
        "/static/%2e%2e/%2e%2e/pyproject.toml",
        "/static/..%2f..%2fpyproject.toml",
    ):
        status, body, _ = await trio.to_thread.run_sync(_get, f"{base_url}{path}")
        assert status == 404, path
        assert b"omnitrio" not in body


async def test_dns_rebinding_names_are_refused(base_url: str) -> None:
    port = base_url.rsplit(":", 1)[1]
    rebound = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
    status, _, _ = await trio.to_thread.run_sync(_get, f"{base_url}/v1/models", rebound)
    assert status == 421
    status, _, _ = await trio.to_thread.run_sync(_get, f"{base_url}/", rebound)
    assert status == 421
    same_site = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
    status, _, _ = await trio.to_thread.run_sync(_get, f"{base_url}/v1/models", same_site)
    assert status == 200


async def test_chat_input_audio_reaches_the_pipeline_or_is_refused(base_url: str) -> None:
    from omnitrio.server._audio import wav_bytes

    def ask(part: dict[str, object]) -> str | int:
        try:
            reply = _client(base_url).chat.completions.create(
                model="test",
                messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}],  # type: ignore[list-item]
            )
        except openai.BadRequestError as exc:
            return exc.status_code
        return reply.choices[0].message.content or ""

    wav = base64.b64encode(wav_bytes(bytes(3200), 16000)).decode()
    ok = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
    assert await trio.to_thread.run_sync(ask, ok) == "".join(f"a:{i} " for i in range(1, 7))
    mp3 = {"type": "input_audio", "input_audio": {"data": wav, "format": "mp3"}}
    assert await trio.to_thread.run_sync(ask, mp3) == 400
    junk = {"type": "input_audio", "input_audio": {"data": "bm90IGEgd2F2", "format": "wav"}}
    assert await trio.to_thread.run_sync(ask, junk) == 400
