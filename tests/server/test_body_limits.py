"""A body over ``max_message_bytes`` on every ``/v1/*`` POST is a 413 in OpenAI's JSON
shape naming the limit (issue 27: it was werkzeug's HTML page), whether the body
declares its length or is chunked, and the server serves on after it."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import trio

from tests.conftest import serve_chain

STAGES: list[dict[str, object]] = [
    {"steps": 3},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
LIMIT_BYTES = 64 * 1024
POSTS = [
    ("/v1/chat/completions", "application/json"),
    ("/v1/audio/speech", "application/json"),
    ("/v1/audio/transcriptions", "multipart/form-data; boundary=b0undary"),
]


def _exchange(port: int, head: bytes, body_parts: list[bytes]) -> tuple[int, dict[str, Any]]:
    """Send ``head`` and as much of the body as the server takes, then read the
    answer: (status, its JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered before the body was all sent: the answer is still there
        with sock.makefile("rb") as reader:
            status = int(reader.readline().split()[1])
            fields: dict[str, str] = {}
            while (line := reader.readline().strip()) != b"":
                name, _, value = line.decode().partition(":")
                fields[name.lower()] = value.strip()
            assert fields["content-type"] == "application/json", fields
            return status, json.loads(reader.read(int(fields["content-length"])))


def _declared(port: int, path: str, content_type: str) -> tuple[int, dict[str, Any]]:
    body = b"x" * (4 * LIMIT_BYTES)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return _exchange(port, head.encode(), [body])


def _chunked(port: int, path: str, content_type: str) -> tuple[int, dict[str, Any]]:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"  # 16 KiB each, no length declared
    return _exchange(port, head.encode(), [chunk] * 8 + [b"0\r\n\r\n"])


def _chat(port: int) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return _exchange(port, head.encode() + body, [])


@pytest.mark.parametrize(("path", "content_type"), POSTS)
async def test_a_body_over_the_limit_is_a_json_413_and_the_server_serves_on(
    nursery: trio.Nursery, path: str, content_type: str
) -> None:
    port = await serve_chain(nursery, STAGES, 4, max_message_bytes=LIMIT_BYTES)
    for send in (_declared, _chunked):
        status, body = await trio.to_thread.run_sync(send, port, path, content_type)
        assert status == 413, (send.__name__, body)
        error = body["error"]
        assert error["code"] == "request_too_large"
        assert error["type"] == "invalid_request_error"
        assert f"limit of {LIMIT_BYTES} bytes (max_message_bytes)" in error["message"]
        status, answer = await trio.to_thread.run_sync(_chat, port)
        assert status == 200, answer  # served on, on a fresh connection
        assert answer["object"] == "chat.completion"
