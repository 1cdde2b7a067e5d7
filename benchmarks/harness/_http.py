"""A small HTTP/1.1 client on trio and h11: one request per connection, body streamed.

Enough for the benchmark (POST a JSON body, read an SSE stream or a small
document); not a general client. Loopback only unless the caller allows more.
"""

from __future__ import annotations

import email.utils
import ipaddress
import socket
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import h11
import trio


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    base_path: str  # "" or "/prefix", no trailing slash

    @classmethod
    def parse(cls, url: str, *, allow_remote: bool = False) -> Endpoint:
        """``http://host:port[/prefix]``; refuses non-loopback hosts unless allowed."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "ws") or not parts.hostname:
            raise ValueError(f"--url {url!r}: give http://HOST:PORT (https is not supported)")
        if not allow_remote and not _is_loopback(parts.hostname):
            raise ValueError(
                f"--url {url!r} is not a loopback address; pass --allow-remote to load "
                "another machine"
            )
        return cls(parts.hostname, parts.port or 80, parts.path.rstrip("/"))

    def ws_url(self, path: str) -> str:
        return f"ws://{self.host}:{self.port}{self.base_path}{path}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Response:
    status: int
    body: AsyncIterator[bytes]
    headers: Mapping[str, str] = field(default_factory=dict)
    """By lower-case name (the last of a repeated one)."""

    @property
    def retry_after_s(self) -> float | None:
        """The ``Retry-After`` header in seconds (None: absent or not a time)."""
        return retry_after_s(self.headers.get("retry-after"))


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` value (RFC 9110: delay-seconds or an HTTP-date) in seconds from
    ``now`` (None: absent or neither)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    now = now or datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


@asynccontextmanager
async def http_request(
    endpoint: Endpoint, method: str, path: str, body: bytes = b"", content_type: str = ""
) -> AsyncIterator[Response]:
    """Send one request and yield the response, its body read lazily in pieces."""
    stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
    stream.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        headers = [("Host", f"{endpoint.host}:{endpoint.port}"), ("Connection", "close")]
        if body:
            headers += [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        out = conn.send(
            h11.Request(method=method, target=endpoint.base_path + path, headers=headers)
        )
        out += conn.send(h11.Data(data=body)) if body else b""
        out += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(out or b"")
        event = await _next_event(stream, conn)
        if not isinstance(event, h11.Response):
            raise ConnectionError(f"expected an HTTP response, got {type(event).__name__}")
        pieces = _body(stream, conn)
        async with aclosing(pieces):
            answered = {
                bytes(k).decode("latin-1"): bytes(v).decode("latin-1") for k, v in event.headers
            }
            yield Response(event.status_code, pieces, answered)


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(65536))


async def _body(stream: trio.SocketStream, conn: h11.Connection) -> AsyncGenerator[bytes]:
    while True:
        event = await _next_event(stream, conn)
        if isinstance(event, h11.Data):
            yield bytes(event.data)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return


async def get_text(endpoint: Endpoint, path: str) -> tuple[int, str]:
    async with http_request(endpoint, "GET", path) as response:
        body = b"".join([piece async for piece in response.body])
    return response.status, body.decode("utf-8", "replace")


async def sse_events(pieces: AsyncIterator[bytes]) -> AsyncGenerator[str]:
    """The ``data:`` payloads of a server-sent event stream, one per event."""
    buffer = b""
    async for piece in pieces:
        buffer += piece
        while b"\n\n" in buffer:
            raw, buffer = buffer.split(b"\n\n", 1)
            data = [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
            if data:
                yield b"\n".join(data).decode()
