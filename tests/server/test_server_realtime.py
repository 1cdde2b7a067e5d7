"""The Realtime WebSocket endpoint, driven by the official ``openai`` SDK and by raw peers."""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.request

import msgpack
import openai
import pytest
import trio
import trio_websocket
import websockets
import websockets.sync.client

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config

SPEAKING = [
    {"steps": 6, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
ENDLESS = [
    {"steps": 100_000, "service_time_ms": 2.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]


async def _server(
    nursery: trio.Nursery, stages: list[dict[str, object]], **settings: object
) -> str:
    config = chain_config(stages, max_streams=4)
    binds = await nursery.start(serve, config, ServerSettings(port=0, **settings))  # type: ignore[arg-type]
    return str(binds[0])


def _open_streams(base_url: str) -> float:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^omnitrio_open_streams (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


def _healthy(base_url: str) -> bool:
    with urllib.request.urlopen(f"{base_url}/health", timeout=10) as response:
        return response.status == 200


def _until_done(conn: object) -> tuple[list[str], bytes, str]:
    """Events of one response: (types, audio bytes, transcript) up to response.done."""
    types: list[str] = []
    audio, transcript = b"", ""
    for event in conn:  # type: ignore[attr-defined]
        types.append(event.type)
        if event.type == "response.output_audio.delta":
            audio += base64.b64decode(event.delta)
        elif event.type == "response.output_audio_transcript.delta":
            transcript += event.delta
        elif event.type == "response.done":
            return types, audio, transcript
        elif event.type == "error":
            raise AssertionError(f"error event: {event.error}")
    raise AssertionError("connection ended before response.done")


async def test_sdk_text_turn_and_audio_turn(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING)

    def run() -> None:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        with client.realtime.connect(model="test") as conn:
            assert conn.recv().type == "session.created"
            conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
            assert conn.recv().type == "session.updated"
            # A text turn.
            conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hello"}],
                }
            )
            conn.response.create()
            types, audio, transcript = _until_done(conn)
            assert "response.created" in types
            assert transcript == "".join(f"a:{i} " for i in range(1, 7))
            assert len(audio) == 6 * 480 * 2  # 6 chunks, 16 kHz -> 24 kHz
            # An audio turn: 0.5 s of 24 kHz PCM16 in two appends.
            pcm = bytes(24000)
            for half in (pcm[:12000], pcm[12000:]):
                conn.input_audio_buffer.append(audio=base64.b64encode(half).decode())
            conn.input_audio_buffer.commit()
            conn.response.create()
            types, audio, _ = _until_done(conn)
            assert "input_audio_buffer.committed" in types
            assert len(audio) == 6 * 480 * 2

    with trio.fail_after(30):
        await trio.to_thread.run_sync(run)
    assert await trio.to_thread.run_sync(_open_streams, base_url) == 0


async def test_sdk_cancel_stops_the_deltas_and_the_work(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, ENDLESS)

    def run() -> tuple[str, float]:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        with client.realtime.connect(model="test") as conn:
            conn.recv()
            conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "x"}],
                }
            )
            conn.response.create()
            for event in conn:
                if event.type == "response.output_audio.delta":
                    break
            during = _open_streams(base_url)
            conn.response.cancel()
            for event in conn:
                if event.type == "response.done":
                    return event.response.status or "", during
        raise AssertionError("no response.done")

    with trio.fail_after(30):
        status, during = await trio.to_thread.run_sync(run)
    assert (status, during) == ("cancelled", 1.0)
    assert await trio.to_thread.run_sync(_open_streams, base_url) == 0


async def test_msgpack_framing_carries_raw_audio(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING)
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with trio_websocket.open_websocket_url(url, subprotocols=["omnitrio.msgpack.v1"]) as ws:
        assert ws.subprotocol == "omnitrio.msgpack.v1"
        assert msgpack.unpackb(await ws.get_message())["type"] == "session.created"
        await ws.send_message(
            msgpack.packb({"type": "input_audio_buffer.append", "audio": bytes(4800)})
        )
        await ws.send_message(msgpack.packb({"type": "input_audio_buffer.commit"}))
        await ws.send_message(msgpack.packb({"type": "response.create"}))
        audio = b""
        with trio.fail_after(10):
            while True:
                event = msgpack.unpackb(await ws.get_message())
                if event["type"] == "response.output_audio.delta":
                    assert isinstance(event["delta"], bytes)
                    audio += event["delta"]
                if event["type"] == "response.done":
                    break
        assert len(audio) == 6 * 480 * 2


BAD_FRAMES: list[tuple[str | bytes, str]] = [
    ("{not json", "invalid"),
    (json.dumps({"type": "no.such.event"}), "no.such.event"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": 42}), "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%not base64"}), "base64"),
    (b"\x00\xff\x13garbage", "binary"),
    (json.dumps([1, 2, 3]), "object"),
    (b"", "binary"),  # quart hands an empty binary frame over as None
]


@pytest.mark.parametrize(("frame", "mentions"), BAD_FRAMES)
async def test_bad_frames_get_an_error_event_and_the_session_goes_on(
    nursery: trio.Nursery, frame: str | bytes, mentions: str
) -> None:
    base_url = await _server(nursery, SPEAKING)
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with trio_websocket.open_websocket_url(url) as ws:
        json.loads(await ws.get_message())  # session.created
        await ws.send_message(frame)
        with trio.fail_after(10):
            event = json.loads(await ws.get_message())
        assert event["type"] == "error"
        assert mentions.lower() in json.dumps(event["error"]).lower()
        # The same connection still works.
        await ws.send_message(json.dumps({"type": "response.create"}))
        with trio.fail_after(10):
            while json.loads(await ws.get_message())["type"] != "response.done":
                pass
    assert await trio.to_thread.run_sync(_healthy, base_url)


async def test_oversized_frame_closes_with_1009_and_server_stays_up(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING, max_message_bytes=64 * 1024)
    url = base_url.replace("http", "ws") + "/v1/realtime"

    def send_too_much() -> int | None:
        with websockets.sync.client.connect(url, open_timeout=10, ping_interval=None) as ws:
            ws.recv(timeout=10)  # session.created
            ws.send("x" * (128 * 1024))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                ws.recv(timeout=10)
        return closed.value.rcvd.code if closed.value.rcvd else None

    assert await trio.to_thread.run_sync(send_too_much) == 1009
    assert await trio.to_thread.run_sync(_healthy, base_url)


async def test_disconnect_mid_response_frees_the_stream(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, ENDLESS)
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with trio_websocket.open_websocket_url(url) as ws:
        await ws.get_message()
        await ws.send_message(json.dumps({"type": "response.create"}))
        with trio.fail_after(10):
            while json.loads(await ws.get_message())["type"] != "response.output_audio.delta":
                pass
        assert await trio.to_thread.run_sync(_open_streams, base_url) == 1
    with trio.fail_after(10):
        while await trio.to_thread.run_sync(_open_streams, base_url) != 0:  # noqa: ASYNC110 - no event crosses the socket
            await trio.sleep(0.05)  # the server notices the close on its own schedule
    assert await trio.to_thread.run_sync(_healthy, base_url)


async def test_trailing_bytes_after_the_upgrade_cost_only_that_connection(
    nursery: trio.Nursery,
) -> None:
    # hypercorn #225: this used to end hypercorn's serve() for everybody.
    base_url = await _server(nursery, SPEAKING)
    host, port = base_url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    upgrade = (
        f"GET /v1/realtime HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\nX"
    ).encode()
    await stream.send_all(upgrade)
    with trio.move_on_after(2):
        await stream.receive_some(4096)
    await stream.aclose()
    assert await trio.to_thread.run_sync(_healthy, base_url)
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with trio_websocket.open_websocket_url(url) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"


async def _upgrade_status(base_url: str, headers: dict[str, str]) -> int:
    """The HTTP status a WebSocket upgrade request gets (a raw request: no client library)."""
    host, port = base_url.removeprefix("http://").split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"GET /v1/realtime HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(request.encode())
        with trio.fail_after(10):
            status_line = (await stream.receive_some(4096)).split(b"\r\n", 1)[0]
    return int(status_line.split()[1])


async def test_api_key_and_origin_on_the_websocket(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING, api_key="sekrit")
    assert await _upgrade_status(base_url, {}) == 401
    assert await _upgrade_status(base_url, {"Authorization": "Bearer wrong"}) == 401
    evil = {"Authorization": "Bearer sekrit", "Origin": "http://evil.example"}
    assert await _upgrade_status(base_url, evil) == 403
    assert await _upgrade_status(base_url, {"Authorization": "Bearer sekrit"}) == 101
    # Browsers pass the key as a subprotocol.
    url = base_url.replace("http", "ws") + "/v1/realtime"
    subprotocols = ["realtime", "openai-insecure-api-key.sekrit"]
    async with trio_websocket.open_websocket_url(url, subprotocols=subprotocols) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.get_message())["type"] == "session.created"


async def test_a_client_that_stops_reading_is_closed_and_costs_nobody_else(
    nursery: trio.Nursery,
) -> None:
    # Big audio chunks fill the socket buffers fast; the stalled client's response
    # stops reading the pipeline, and after send_timeout_s the server hangs up.
    loud = [
        {"steps": 100_000, "service_time_ms": 1.0},
        {"outputs_per_input": 0, "visible": "audio", "audio_samples": 16000},
    ]
    base_url = await _server(nursery, loud, send_timeout_s=1.0)
    url = base_url.replace("http", "ws") + "/v1/realtime"

    def stall_then_read() -> tuple[int | None, int]:
        with websockets.sync.client.connect(
            url, open_timeout=10, max_queue=2, ping_interval=None
        ) as ws:
            ws.recv(timeout=10)
            ws.send(json.dumps({"type": "response.create"}))
            time.sleep(4)  # read nothing: a stalled player (a thread: no event to wait on)
            num_received = 0
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=10)
                    num_received += 1
        # A reader that took nothing cannot be handed a close frame either: the
        # server drops the connection; a close code arrives only if it fit.
        return (closed.value.rcvd.code if closed.value.rcvd else None), num_received

    other_ok = trio.Event()

    async def meanwhile() -> None:
        # Another connection on the same server while the first one stalls: it
        # gets its session and a prompt answer to a request.
        await trio.sleep(1.5)  # well inside the stall
        async with trio_websocket.open_websocket_url(url) as ws:
            assert json.loads(await ws.get_message())["type"] == "session.created"
            await ws.send_message(json.dumps({"type": "response.cancel"}))  # nothing to cancel
            with trio.fail_after(2):
                assert json.loads(await ws.get_message())["type"] == "error"
        other_ok.set()

    async with trio.open_nursery() as inner:
        inner.start_soon(meanwhile)
        with trio.fail_after(30):
            code, num_received = await trio.to_thread.run_sync(stall_then_read)
    assert code in (None, 1008)
    assert num_received < 1000  # what sat in the buffers, not an endless stream
    assert other_ok.is_set()
    with trio.fail_after(10):
        while await trio.to_thread.run_sync(_open_streams, base_url) != 0:  # noqa: ASYNC110 - no event crosses the socket
            await trio.sleep(0.05)


async def test_session_length_limit_closes_the_connection(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery, SPEAKING, max_session_s=0.5)
    url = base_url.replace("http", "ws") + "/v1/realtime"

    def wait_for_close() -> tuple[int | None, str]:
        with websockets.sync.client.connect(url, open_timeout=10, ping_interval=None) as ws:
            ws.recv(timeout=10)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                ws.recv(timeout=10)
        rcvd = closed.value.rcvd
        return (rcvd.code, rcvd.reason) if rcvd else (None, "")

    code, reason = await trio.to_thread.run_sync(wait_for_close)
    assert code == 1008
    assert "session length limit" in reason


async def test_a_full_pipeline_refuses_new_connections_with_1013(nursery: trio.Nursery) -> None:
    config = chain_config(ENDLESS, max_streams=1)
    (base_url, *_) = await nursery.start(serve, config, ServerSettings(port=0))
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with trio_websocket.open_websocket_url(url) as busy:
        await busy.get_message()
        await busy.send_message(json.dumps({"type": "response.create"}))
        while json.loads(await busy.get_message())["type"] != "response.output_audio.delta":
            pass

        def refused() -> tuple[dict[str, object], int | None, str]:
            with websockets.sync.client.connect(url, open_timeout=10, ping_interval=None) as ws:
                first = json.loads(ws.recv(timeout=10))
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    ws.recv(timeout=10)
            rcvd = closed.value.rcvd
            return (first, *((rcvd.code, rcvd.reason) if rcvd else (None, "")))

        first, code, reason = await trio.to_thread.run_sync(refused)
        # An error event says when to retry (no stream completed yet: the 1 s default),
        # and the close's reason says it too, for a client that reads only that.
        assert first["type"] == "error"
        error = first["error"]
        assert isinstance(error, dict)
        assert error["code"] == "server_overloaded"
        assert error["retry_after_ms"] == 1000
        assert "max_streams" in str(error["message"])
        assert (code, reason) == (1013, "server busy; retry after 1000 ms")


async def test_barge_in_frees_the_slot_before_response_done(nursery: trio.Nursery) -> None:
    config = chain_config(ENDLESS, max_streams=1)
    (base_url, *_) = await nursery.start(serve, config, ServerSettings(port=0))
    url = base_url.replace("http", "ws") + "/v1/realtime"

    async def until(ws: trio_websocket.WebSocketConnection, kind: str) -> dict[str, object]:
        while True:
            event: dict[str, object] = json.loads(await ws.get_message())
            if event["type"] == kind:
                return event

    async with trio_websocket.open_websocket_url(url) as ws:
        await ws.get_message()
        with trio.fail_after(10):
            for _ in range(3):  # speak over the reply, again and again
                await ws.send_message(json.dumps({"type": "response.create"}))
                await until(ws, "response.output_audio.delta")
                await ws.send_message(json.dumps({"type": "response.cancel"}))
                done = await until(ws, "response.done")
                assert done["response"]["status"] == "cancelled"  # type: ignore[index]
