"""The bench's HTTP and Realtime clients: a refusal's ``Retry-After`` (a full server's
1013, its ``retry_after_ms``) reaches the load loop, as the in-process client's
``Overloaded.retry_after_s`` does."""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio

from benchmarks.harness._http import Endpoint, retry_after_s
from benchmarks.harness._server import ChatTarget, RealtimeTarget
from benchmarks.harness._target import Prompt, Refused, Timeline
from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config
from tests.server.test_server_process import _signal_and_wait, start_server
from tests.server.test_server_realtime import ENDLESS

ONE_SLOW_STREAM = """
pipeline: {name: one-slot, max_streams: 1}
stages:
  - name: thinker
    impl: stages.synthetic:SyntheticStage
    params: {steps: 400, outputs_per_input: 0, visible: text, service_time_ms: 10.0}
"""


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("3") == 3.0
    assert retry_after_s(" 0 ") == 0.0
    assert retry_after_s("Thu, 01 Jan 2026 12:00:05 GMT", now) == 5.0
    assert retry_after_s("Thu, 01 Jan 2026 11:59:00 GMT", now) == 0.0  # past: at once
    assert retry_after_s(None) is None
    assert retry_after_s("soon") is None
    assert retry_after_s("-1") is None


class _Heard(Timeline):
    """A timeline that says when its first text or audio came (the stream was admitted)."""

    def __init__(self, heard: trio.Event) -> None:
        super().__init__()
        self.heard = heard

    def text(self) -> None:
        super().text()
        self.heard.set()

    def audio_chunk(self, duration_s: float) -> None:
        super().audio_chunk(duration_s)
        self.heard.set()


def test_a_refused_chat_request_carries_the_servers_retry_after(tmp_path: Path) -> None:
    config = tmp_path / "one-slot.yaml"
    config.write_text(ONE_SLOW_STREAM)
    process, url = start_server("--config", str(config), "--port", "0")
    target = ChatTarget(Endpoint.parse(url))
    refusals: list[Refused] = []

    async def main() -> None:
        heard = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(target.request, Prompt(0, "hello", 400), _Heard(heard))
            await heard.wait()  # the one slot is taken
            with pytest.raises(Refused) as refused:
                await target.request(Prompt(1, "hello", 4), Timeline())
            refusals.append(refused.value)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        _signal_and_wait(process, signal.SIGTERM)
    # The server sends whole seconds, at least 1 (no stream completed: its default).
    assert refusals[0].retry_after_s == 1.0


async def test_a_realtime_session_a_full_server_refuses_carries_its_retry_hint(
    nursery: trio.Nursery,
) -> None:
    (base_url, *_) = await nursery.start(
        serve, chain_config(ENDLESS, max_streams=1), ServerSettings(port=0)
    )
    heard = trio.Event()
    playing = RealtimeTarget(Endpoint.parse(base_url), "json")
    nursery.start_soon(playing.request, Prompt(0, "hello", 400), _Heard(heard))
    with trio.fail_after(10):
        await heard.wait()  # the one slot is taken
        with pytest.raises(Refused) as refused:
            await RealtimeTarget(Endpoint.parse(base_url), "json").request(
                Prompt(1, "hello", 4), Timeline()
            )
    # No stream completed: the server's default, 1 s (before: no hint, "close 1013").
    assert refused.value.retry_after_s == 1.0
    assert "max_streams" in str(refused.value)
    nursery.cancel_scope.cancel()
