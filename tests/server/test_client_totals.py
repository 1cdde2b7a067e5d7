"""One client's totals across its Realtime sessions (omnitrio/server/_client_totals.py):
the input its sessions hold together, and the sessions open with one API key
(issue 42, attack 11)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio_websocket

from omnitrio.realtime import RealtimeSession, SessionConfig
from omnitrio.server import ServerSettings, serve
from omnitrio.server._client_totals import ClientTotals, SessionRefused
from tests.conftest import chain_config

SECOND_S = 48_000  # bytes of PCM16 at 24 kHz
APPEND = json.dumps(
    {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(SECOND_S)).decode()}
)
PROBE = json.dumps({"type": "response.cancel"})  # nothing to cancel: an error comes back at once
SPEAKING = [
    {"steps": 4, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]


async def _serve(nursery: trio.Nursery, **settings: object) -> str:
    config = chain_config(SPEAKING, max_streams=4)
    (base_url, *_) = await nursery.start(serve, config, ServerSettings(port=0, **settings))  # type: ignore[arg-type]
    return str(base_url).replace("http", "ws") + "/v1/realtime"


@asynccontextmanager
async def _session(
    url: str, source: str = "127.0.0.1", headers: list[tuple[str, str]] | None = None
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A Realtime session from ``source`` (another loopback address is another client)."""
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port), local_address=source)
    async with trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(
            nursery, stream, host, "/v1/realtime", extra_headers=headers
        )
        try:
            yield ws
        finally:
            await ws.aclose()


async def _events_until_probe(ws: trio_websocket.WebSocketConnection) -> list[dict[str, object]]:
    """Send the probe; the events before its answer (the probe's error left out)."""
    await ws.send_message(PROBE)
    seen: list[dict[str, object]] = []
    with trio.fail_after(10):
        while True:
            event = json.loads(await ws.get_message())
            error = event.get("error") if event["type"] == "error" else None
            if isinstance(error, dict) and error["code"] == "response_cancel_not_active":
                return seen
            seen.append(event)


def _memory_errors(events: list[dict[str, object]]) -> int:
    return sum(
        e["type"] == "error" and e["error"]["code"] == "client_memory_full"  # type: ignore[index]
        for e in events
    )


async def _append(ws: trio_websocket.WebSocketConnection, seconds: int) -> int:
    """Append ``seconds`` of audio a second a frame; how many frames were refused."""
    for _ in range(seconds):
        await ws.send_message(APPEND)
    return _memory_errors(await _events_until_probe(ws))


async def test_one_clients_sessions_hold_at_most_its_total_and_it_can_make_room(
    nursery: trio.Nursery,
) -> None:
    url = await _serve(nursery, max_client_held_bytes=400_000)
    async with _session(url) as first, _session(url) as second:
        await first.get_message()  # session.created
        await second.get_message()
        assert await _append(first, 5) == 0  # 240,000 bytes held
        # 288,000 and 336,000 pass; a third frame (~64 kB of base64) could pass 400,000
        assert await _append(second, 5) == 3
        async with _session(url, source="127.0.0.2") as other:  # another client: its own total
            await other.get_message()
            assert await _append(other, 5) == 0
        # What frees room is never refused, and then the client may append again.
        await first.send_message(json.dumps({"type": "input_audio_buffer.clear"}))
        cleared = await _events_until_probe(first)
        assert [e["type"] for e in cleared] == ["input_audio_buffer.cleared"]
        assert await _append(second, 1) == 0
    # The sessions have ended: what they held is the client's again.
    async with _session(url) as third:
        await third.get_message()
        assert await _append(third, 6) == 0


async def test_sessions_past_an_api_keys_share_are_refused_with_a_retry_hint(
    nursery: trio.Nursery,
) -> None:
    url = await _serve(nursery, api_key="k", max_sessions_per_key=2)
    key = [("Authorization", "Bearer k")]
    async with _session(url, headers=key) as first:
        async with _session(url, headers=key) as second:
            assert json.loads(await first.get_message())["type"] == "session.created"
            assert json.loads(await second.get_message())["type"] == "session.created"
            async with _session(url, headers=key) as third:
                with trio.fail_after(10):
                    refused = json.loads(await third.get_message())
                    with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                        await third.get_message()
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1013
            assert refused["type"] == "error"
            assert refused["error"]["code"] == "too_many_sessions"
            assert "max_sessions_per_key" in refused["error"]["message"]
            assert refused["error"]["retry_after_s"] >= 1
        # One closed: a new one gets in.
        async with _session(url, headers=key) as fourth:
            assert json.loads(await fourth.get_message())["type"] == "session.created"


def test_the_totals_count_each_session_until_it_closes() -> None:
    totals = ClientTotals(max_held_bytes=100, max_sessions_per_key=1)
    one = totals.open_session("a", "key")
    one.update(60)
    two = totals.open_session("a", None)
    two.update(30)
    assert totals.held["a"] == 90
    with pytest.raises(SessionRefused, match="max_sessions_per_key"):
        totals.open_session("b", "key")  # another address, the same key
    one.close()
    one.close()  # twice is once
    assert totals.held["a"] == 30
    totals.open_session("b", "key").close()
    two.close()
    assert not totals.held
    assert not totals.sessions_by_key
    held = totals.open_session("a", "s3cr3t")
    assert "s3cr3t" not in repr(totals.__dict__)  # only digests are kept
    held.close()


def test_a_session_holds_its_audio_items_and_instructions() -> None:
    session = RealtimeSession(SessionConfig(session_id="s", model="m"))
    session.start()
    assert session.held_bytes() == 0
    session.receive(APPEND)
    session.receive(json.dumps({"type": "session.update", "session": {"instructions": "x" * 500}}))
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    session.receive(json.dumps({"type": "conversation.item.create", "item": item}))
    assert SECOND_S + 500 + 2 <= session.held_bytes() <= SECOND_S + 500 + 64
    before = session.held_bytes()
    # Instructions count in bytes, not characters: 500 three-byte characters are 1,500.
    session.receive(json.dumps({"type": "session.update", "session": {"instructions": "€" * 500}}))
    assert session.held_bytes() == before + 1000
