"""Hostile clients against the real server on loopback (issue 16): each test reproduces
one attack and checks the promise — the attacker gets a clear refusal naming what was
wrong (never an internal exception's text), the server stays up and serves others, and
what the attacker made the server hold is given back. ``benchmarks/reliability/attacks.py`` runs
the same attacks at full size against ``omnitrio run``."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import msgpack
import pytest
import trio

from omnitrio.realtime import RealtimeSession, SessionConfig
from tests.conftest import count_tasks, http_request, serve_chain
from tests.server.test_server_process import (
    _wait_for_open_streams,
    endless_config,
    read_streaming_chat,
    start_server,
)

REPO = Path(__file__).resolve().parents[2]

SPEAKING = [
    {"steps": 6, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]


async def _server(
    nursery: trio.Nursery,
    stages: list[dict[str, object]] = SPEAKING,
    max_streams: int = 4,
    **settings: object,
) -> int:
    return await serve_chain(nursery, stages, max_streams, **settings)


def _chat(port: int, content: object) -> tuple[int, bytes]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    status, _, data = http_request(port, "POST", "/v1/chat/completions", body.encode())
    return status, data


def _wav(rate_hz: int, num_samples: int) -> bytes:
    data = b"\x01\x00" * num_samples
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, rate_hz, (rate_hz * 2) & 0xFFFFFFFF, 2, 16)
    return header + b"data" + struct.pack("<I", len(data)) + data


def _audio_part(wav: bytes) -> list[dict[str, object]]:
    audio = {"format": "wav", "data": base64.b64encode(wav).decode()}
    return [{"type": "input_audio", "input_audio": audio}]


@pytest.mark.parametrize(
    ("rate_hz", "num_samples", "named"),
    [
        (100, 350_000, "sample rate 100 Hz is outside the supported 8000-96000 Hz"),
        (0, 1000, "sample rate 0 Hz is outside"),
        (2**32 - 1, 1000, "sample rate 4294967295 Hz is outside"),
        (8000, 8000 * 3, "3.0 s of audio is over the limit of 2 s"),
    ],
)
async def test_uploaded_audio_outside_the_limits_is_a_400_naming_it(
    nursery: trio.Nursery, rate_hz: int, num_samples: int, named: str
) -> None:
    # Attack (issue 16 #1): a WAV whose header claims 100 Hz resampled into an hour of
    # audio and held the ASR stage for 60 s; rate 0 was a 500 with ZeroDivisionError.
    port = await _server(nursery, max_input_audio_s=2.0)
    status, body = await trio.to_thread.run_sync(
        _chat, port, _audio_part(_wav(rate_hz, num_samples))
    )
    assert status == 400
    error = json.loads(body)["error"]
    assert named in error["message"]
    assert error["param"] == "messages.0.content.0.input_audio.data"
    status, _ = await trio.to_thread.run_sync(_chat, port, "hello")  # and it serves on
    assert status == 200


@pytest.mark.parametrize(
    "headers",
    [{"Host": "["}, {"Host": "[::1"}, {"Host": "a]b"}, {"Origin": "http://["}],
)
async def test_hosts_and_origins_that_do_not_parse_are_refused_not_500(
    nursery: trio.Nursery, headers: dict[str, str]
) -> None:
    # Attack (issue 16 #7): urlsplit raised in the guard: a 500 and a traceback each.
    port = await _server(nursery)
    status, _, body = await trio.to_thread.run_sync(
        lambda: http_request(port, "GET", "/v1/models", headers=headers)
    )
    assert status == (403 if "Origin" in headers else 421)
    assert "Traceback" not in body.decode()
    assert "ValueError" not in body.decode()


async def test_concurrent_speech_past_max_streams_is_200_whole_or_503(
    nursery: trio.Nursery,
) -> None:
    # Attack (issue 16 #6): the 503 check ran in the handler but the stream opened in
    # the body, so requests past max_streams got a 200 with a cut body.
    # One client here: its share (max_streams_per_client) is above max_streams.
    port = await _server(nursery, max_streams=2, max_streams_per_client=24)
    body = json.dumps({"model": "m", "input": "hello", "response_format": "wav"}).encode()
    results: list[tuple[int, int]] = []

    def one() -> None:
        status, _, data = http_request(port, "POST", "/v1/audio/speech", body)
        results.append((status, len(data)))

    threads = [threading.Thread(target=one) for _ in range(24)]
    await trio.to_thread.run_sync(
        lambda: [t.start() for t in threads] and [t.join() for t in threads]
    )
    full = max(size for status, size in results if status == 200)
    assert full > 44  # a WAV header and audio
    assert sorted({status for status, _ in results}) == [200, 503]
    assert all(size == full for status, size in results if status == 200)


async def test_connections_past_the_limit_get_a_503_and_the_server_serves_on(
    nursery: trio.Nursery,
) -> None:
    # Attack (issue 16 #9): idle connections up to the fd limit: EMFILE tracebacks, and
    # /health and new turns timed out. Now the connection past the limit is refused.
    port = await _server(nursery, max_connections=8)

    def fill_then_release() -> tuple[bytes, int]:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
        time.sleep(0.3)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                refusal = extra.makefile("rb").read()  # the server closes it after the 503
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.3)
        return refusal, http_request(port, "GET", "/health")[0]

    refusal, health = await trio.to_thread.run_sync(fill_then_release)
    assert refusal.startswith(b"HTTP/1.1 503")
    assert b"too_many_connections" in refusal
    assert b"limit of 8 connections" in refusal
    assert health == 200


async def test_a_refused_upload_does_not_keep_its_connection(nursery: trio.Nursery) -> None:
    # Attack (issue 16 #5): with an API key, an unauthenticated client trickling a
    # chunked body got its 401 but kept the connection open as long as it trickled.
    port = await _server(nursery, api_key="sesame")

    def trickle() -> tuple[bytes, float]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer wrong\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            start = time.monotonic()
            received = b""
            try:
                while time.monotonic() - start < 8:
                    sock.sendall(b"1\r\nx\r\n")
                    sock.settimeout(0.5)
                    try:
                        data = sock.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    received += data
            except OSError:
                pass  # reset while we still sent: closed all the same
            return received, time.monotonic() - start

    received, open_s = await trio.to_thread.run_sync(trickle)
    assert received.startswith(b"HTTP/1.1 401")
    assert open_s < 3


async def test_connection_close_is_honoured(nursery: trio.Nursery) -> None:
    # Found with #5: hypercorn's close ran in a task quart cancels; it was lost.
    port = await _server(nursery)

    def ask() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.makefile("rb").read()  # to EOF: times out if the server keeps it

    assert (await trio.to_thread.run_sync(ask)).startswith(b"HTTP/1.1 200")


async def test_h2c_is_off_by_default(nursery: trio.Nursery) -> None:
    # Attack (issue 16 #4): an HTTP/2 client that never opens its flow-control window
    # made the server buffer whole answers; h2c is off unless the settings turn it on.
    port = await _server(nursery)

    def preface() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            settings_frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings_frame)
            return sock.makefile("rb").read()

    refusal = await trio.to_thread.run_sync(preface)
    assert refusal.startswith(b"HTTP/1.1 505")
    assert b"h2c" in refusal
    status, _, _ = await trio.to_thread.run_sync(
        lambda: http_request(
            port, "GET", "/health", headers={"Connection": "Upgrade", "Upgrade": "h2c"}
        )
    )
    assert status == 200  # the upgrade is ignored; HTTP/1.1 answers


def test_a_long_event_id_is_refused_not_echoed() -> None:
    # Attack (issue 16 #3): 1 MiB event_ids echoed whole in each error event, 64 queued
    # per non-reading connection: RSS 197 -> 1110 MB for 10 clients.
    session = RealtimeSession(SessionConfig(session_id="s", model="m"))
    session.start()
    for frame in (
        json.dumps({"type": "nonsense", "event_id": "e" * 100_000}),
        json.dumps({"type": "response.cancel", "event_id": "e" * 100_000}),
    ):
        (error,) = session.receive(frame)
        encoded = session.encode(error)
        assert len(encoded) < 1000
        assert json.loads(encoded)["error"]["event_id"] is None
    assert "event_id is 100000 characters, over the limit of 256" in str(encoded)
    (error,) = session.receive(json.dumps({"type": "nonsense", "event_id": "mine"}))
    assert json.loads(session.encode(error))["error"]["event_id"] == "mine"


@pytest.mark.parametrize(
    ("framing", "frame"),
    [
        ("msgpack", msgpack.packb([{}] * 500_000)),
        ("msgpack", msgpack.packb({"type": "x", "a": [[None] * 1000] * 300})),
        ("json", "[" + ",".join(["0"] * 500_000) + "]"),
        ("json", json.dumps({"type": "x", "a": [{}] * 300_000})),
    ],
)
def test_frames_holding_too_many_values_are_refused_cheaply(
    framing: str, frame: str | bytes
) -> None:
    # Attack (issue 16 #8): a flood of 1 MiB frames of empty maps decoded on the event
    # loop (~80 ms each): other clients' first audio 40 -> 512 ms.
    config = SessionConfig(session_id="s", model="m", framing=framing, max_message_bytes=2 << 20)  # type: ignore[arg-type]
    session = RealtimeSession(config)
    session.start()
    start = time.process_time()
    (error,) = session.receive(frame)
    spent_s = time.process_time() - start
    assert error.fields["error"]["code"] == "message_too_large"
    assert "more than 20000 values" in error.fields["error"]["message"]
    # Not a timing test (the machine is shared): decoding the whole frame costs 40-80 ms.
    assert spent_s < 0.03


async def test_a_non_reading_websocket_leaves_no_task_behind(nursery: trio.Nursery) -> None:
    # Attack (issue 16 #2): a client that keeps sending but never reads is closed with
    # 1008 and goes away; hypercorn's reader stayed blocked handing a message to the
    # application that had returned, holding its buffers, for good.
    loud = [
        {"steps": 100_000, "service_time_ms": 1.0},
        {"outputs_per_input": 0, "visible": "audio", "audio_samples": 16000},
    ]
    port = await _server(nursery, loud, send_timeout_s=1.0)
    await trio.sleep(0.5)
    baseline = count_tasks()

    def flood() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        response = b""
        while not response.endswith(b"\r\n\r\n"):
            response += sock.recv(1)
        assert response.startswith(b"HTTP/1.1 101")
        sock.sendall(_masked(json.dumps({"type": "response.create"}).encode()))
        junk = _masked(json.dumps({"type": "nonsense", "pad": "x" * 900_000}).encode())
        sock.settimeout(0.5)
        end = time.monotonic() + 5
        while time.monotonic() < end:  # never read: each frame is one more error event
            try:
                sock.sendall(junk)
            except TimeoutError:
                continue
            except OSError:  # dropped: it read nothing for send_timeout_s
                break
        sock.close()

    await trio.to_thread.run_sync(flood)
    with trio.fail_after(10):
        while count_tasks() > baseline:  # noqa: ASYNC110 - no event marks a task ending
            await trio.sleep(0.1)


def _masked(payload: bytes) -> bytes:
    """A client WebSocket text frame (masked with a zero key: the payload as it is)."""
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", 0x81, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, length)
    return head + b"\x00\x00\x00\x00" + payload


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_ends_the_grace_period_and_exit_is_still_zero(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # Attack (issue 16 #10): SIGTERM twice 0.3 s apart killed the server (exit 143 /
    # 130, no "stopped" line). Now the second one ends the grace period at once.
    config = endless_config(tmp_path)
    process, url = start_server("--config", str(config), "--port", "0", "--grace-period-s", "60")
    try:
        readers = [
            threading.Thread(target=read_streaming_chat, args=(url,), daemon=True) for _ in range(4)
        ]
        for reader in readers:
            reader.start()
        _wait_for_open_streams(url, 4)  # endless answers in flight: the grace period is used
        started = time.monotonic()
        process.send_signal(signum)
        time.sleep(0.3)
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "omnitrio: stopped" in err
    assert elapsed < 10, elapsed  # not the 60 s grace period


async def test_one_client_holds_at_most_its_share_of_the_connections(
    nursery: trio.Nursery,
) -> None:
    # Attack (issue 42 #8): one client holding 1,000 idle Realtime sessions refused every
    # other client (503, /health 503). Now its connections past its share get a 429
    # naming the setting, and another address still gets in.
    port = await _server(nursery, max_connections=12, max_connections_per_client=4)

    def fill_then_ask() -> tuple[bytes, int, int]:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
        time.sleep(0.3)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                refusal = extra.makefile("rb").read()  # the server closes it after the 429
            other_address = ("127.0.0.1", port)
            source = ("127.0.0.2", 0)  # another client: another address
            with socket.create_connection(
                other_address, timeout=10, source_address=source
            ) as other:
                request = (
                    f"GET /health HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n"
                )
                other.sendall(request.encode())
                other_status = int(other.makefile("rb").readline().split()[1])
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.3)
        return refusal, other_status, http_request(port, "GET", "/health")[0]

    refusal, other_status, health = await trio.to_thread.run_sync(fill_then_ask)
    assert refusal.startswith(b"HTTP/1.1 429")
    assert b"too_many_connections" in refusal
    assert b"max_connections_per_client=4" in refusal
    assert b"retry-after: 1" in refusal
    assert other_status == 200  # another client (address) is served meanwhile
    assert health == 200  # and the first one again, once it closed its connections
