"""A refused Realtime response says when to ask again: ``retry_after_ms`` in the failed
response's error, from the pipeline's own estimate (the HTTP API's Retry-After)."""

from __future__ import annotations

import json
import urllib.request

import trio
import trio_websocket

from omnitrio import PipelineConfig
from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config
from tests.realtime.test_realtime_protocol import open_session, start_response, wire
from tests.server.test_realtime_drain import until

ENDLESS = [
    {"steps": 100_000, "service_time_ms": 2.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]


def test_a_failed_response_carries_the_retry_hint_it_is_given() -> None:
    session = open_session()
    start = start_response(session)
    *_, done = session.finish(start.response_id, "failed", "overloaded", retry_after_s=1.2341)
    error = wire(session, done)["response"]["status_details"]["error"]  # type: ignore[arg-type]
    assert error["retry_after_ms"] == 1235
    assert error["message"] == "overloaded"
    start = start_response(session)
    *_, done = session.finish(start.response_id, "failed", "a stage failed")
    error = wire(session, done)["response"]["status_details"]["error"]  # type: ignore[arg-type]
    assert "retry_after_ms" not in error  # not refused: no hint


def _metrics(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


async def _second_response(
    nursery: trio.Nursery,
    config: PipelineConfig,
    settings: ServerSettings,
    *,
    cancel: bool = False,
) -> tuple[str, dict[str, object]]:
    """One client plays a stream on one session, then asks on a second (with ``cancel``,
    cancels it once created): the server's URL, and the second ``response.done``'s
    response."""
    (base_url, *_) = await nursery.start(serve, config, settings)
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with (
        trio_websocket.open_websocket_url(url) as playing,
        trio_websocket.open_websocket_url(url) as second,
    ):
        await playing.get_message()
        await second.get_message()
        with trio.fail_after(10):
            await playing.send_message(json.dumps({"type": "response.create"}))
            await until(playing, "response.output_audio.delta")  # the stream is taken
            await second.send_message(json.dumps({"type": "response.create"}))
            if cancel:
                await until(second, "response.created")
                await second.send_message(json.dumps({"type": "response.cancel"}))
            done = await until(second, "response.done")
            await until(playing, "response.output_audio.delta")  # the first plays on
    response = done["response"]
    assert isinstance(response, dict)
    return base_url, response


async def _refused_error(
    nursery: trio.Nursery, *, max_streams: int, max_streams_per_client: int
) -> dict[str, object]:
    """The second response's error: refused."""
    config = chain_config(ENDLESS, max_streams=max_streams)
    settings = ServerSettings(port=0, max_streams_per_client=max_streams_per_client)
    _, response = await _second_response(nursery, config, settings)
    assert response["status"] == "failed"
    error = response["status_details"]["error"]  # type: ignore[index]
    assert isinstance(error, dict)
    return error


async def test_a_response_the_full_pipeline_refuses_says_when_to_retry(
    nursery: trio.Nursery,
) -> None:
    # One client holds both sessions: its share is the whole pipeline, so the pipeline refuses.
    error = await _refused_error(nursery, max_streams=1, max_streams_per_client=2)
    assert isinstance(error["retry_after_ms"], int)
    assert error["retry_after_ms"] >= 1
    assert "retry" in str(error["message"])


async def test_a_response_over_the_clients_share_says_when_to_retry(
    nursery: trio.Nursery,
) -> None:
    # Room in the pipeline, but the client's share is one stream: its second is refused
    # for the share (not the pipeline), and says when to ask again all the same.
    error = await _refused_error(nursery, max_streams=4, max_streams_per_client=1)
    assert "max_streams_per_client" in str(error["message"])
    assert error["retry_after_ms"] == 1000  # as the HTTP 429's Retry-After: 1


async def test_a_response_cancelled_while_admission_holds_it_ends_at_once(
    nursery: trio.Nursery,
) -> None:
    # pipeline.admission_wait_s: a response.create past max_streams waits for a slot; a
    # response.cancel then ends the wait (the client gave up), not the wait's 30 s.
    config = chain_config(ENDLESS, max_streams=1)
    waiting_pipeline = config.pipeline.model_copy(update={"admission_wait_s": 30.0})
    config = config.model_copy(update={"pipeline": waiting_pipeline})
    settings = ServerSettings(port=0, max_streams_per_client=2)
    base_url, response = await _second_response(nursery, config, settings, cancel=True)
    assert response["status"] == "cancelled"
    metrics = await trio.to_thread.run_sync(_metrics, base_url)  # the server runs in this thread
    assert 'omnitrio_admission_waits_total{outcome="left"} 1.0' in metrics
