"""Hostile WebSocket frames: oversized, compressed bombs, lying lengths, unnegotiated bits.

The promise (issue 7, security checks): a frame or message over
``ServerSettings.max_message_bytes`` is refused with close code 1009 before it is
buffered, a compressed frame is refused before it is inflated past the limit,
and the connection that sent it is the only one to notice.

Most tests speak raw WebSocket over a TCP socket (``RawWebSocket`` below), so
that they can send what no client library would: a frame header that lies about
its length, a compressed frame on a connection that did not negotiate
compression, a deflate bomb built by hand. The server runs in-process, as in
tests/server/test_server_realtime.py; memory is measured with ``tracemalloc`` (the
inflated bytes and the message buffers are Python objects, so it sees them).

hypercorn 0.18 and wsproto alone keep none of the first promise (they count a
message after it is buffered and inflated); ``omnitrio/server/_ws_stream.py``
and ``_frame_limits.py`` make them keep it.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import msgpack
import pytest
import trio
import websockets
import websockets.sync.client

from omnitrio.server import ServerSettings, serve
from tests.conftest import chain_config

LIMIT = 64 * 1024  # max_message_bytes of every server here
SPEAKING = [
    {"steps": 2, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
TEXT, BINARY, CONTINUATION, CLOSE = 0x1, 0x2, 0x0, 0x8
MSGPACK = "omnitrio.msgpack.v1"
MESSAGE_TOO_BIG, PROTOCOL_ERROR, INVALID_PAYLOAD = 1009, 1002, 1007
# Buffering one message of LIMIT bytes, and what a server has in flight besides,
# stays far under this; holding an inflated bomb or an oversized frame does not.
MEMORY_BOUND = 8 * 1024 * 1024


async def _server(nursery: trio.Nursery, **settings: object) -> str:
    config = chain_config(SPEAKING, max_streams=4)
    server_settings = ServerSettings(port=0, max_message_bytes=LIMIT, **settings)  # type: ignore[arg-type]
    binds = await nursery.start(serve, config, server_settings)
    return str(binds[0])


class RawWebSocket:
    """A client WebSocket written by hand: frames exactly as the test builds them."""

    def __init__(self, stream: trio.SocketStream, headers: dict[str, str], buffered: bytes):
        self.stream = stream
        self.headers = headers
        self._buffer = bytearray(buffered)
        # The server compresses what it sends once permessage-deflate is negotiated.
        self._inflater = zlib.decompressobj(-15)

    @classmethod
    async def connect(
        cls, base_url: str, *, deflate: bool = False, subprotocol: str | None = None
    ) -> RawWebSocket:
        host, port = base_url.removeprefix("http://").split(":")
        extra = ""
        if deflate:
            extra += "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
        if subprotocol:
            extra += f"Sec-WebSocket-Protocol: {subprotocol}\r\n"
        request = (
            f"GET /v1/realtime HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
        stream = await trio.open_tcp_stream(host, int(port))
        try:
            await stream.send_all(request.encode())
            response = b""
            while b"\r\n\r\n" not in response:
                data = await stream.receive_some(4096)
                assert data, "the server closed the connection during the handshake"
                response += data
            head, buffered = response.split(b"\r\n\r\n", 1)
            status, *lines = head.decode("latin-1").split("\r\n")
            assert status.split()[1] == "101", status
        except BaseException:
            await stream.aclose()
            raise
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        return cls(stream, headers, buffered)

    @staticmethod
    def frame(
        opcode: int,
        payload: bytes,
        *,
        fin: bool = True,
        rsv1: bool = False,
        declared_length: int | None = None,
    ) -> bytes:
        """One client frame. The masking key is all zeros (legal), so the payload is as is."""
        first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
        length = len(payload) if declared_length is None else declared_length
        if length < 126:
            header = struct.pack("!BB", first, 0x80 | length)
        elif length < 1 << 16:
            header = struct.pack("!BBH", first, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", first, 0x80 | 127, length)
        return header + b"\0\0\0\0" + payload

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset by the server
                data = b""
            if not data:
                return False
            self._buffer += data
        return True

    async def next_frame(self) -> tuple[int, bytes] | None:
        """The server's next frame as (opcode, payload); None when the TCP connection ends."""
        if not await self._fill(2):
            return None
        offset, length = 2, self._buffer[1] & 0x7F
        if length in (126, 127):
            offset = 4 if length == 126 else 10
            if not await self._fill(offset):
                return None
            length = int.from_bytes(self._buffer[2:offset], "big")
        if not await self._fill(offset + length):
            return None
        opcode, payload = self._buffer[0] & 0x0F, bytes(self._buffer[offset : offset + length])
        if self._buffer[0] & 0x40:  # RSV1: compressed (the server sends whole messages)
            payload = self._inflater.decompress(payload + b"\x00\x00\xff\xff")
        del self._buffer[: offset + length]
        return opcode, payload

    async def next_event(self) -> dict[str, object]:
        frame = await self.next_frame()
        assert frame is not None, "the connection ended"
        assert frame[0] in (TEXT, BINARY), frame
        event = json.loads(frame[1]) if frame[0] == TEXT else msgpack.unpackb(frame[1])
        assert isinstance(event, dict)
        return event

    async def close_code(self) -> tuple[int | None, list[dict[str, object]]]:
        """Read to the end: (the close frame's code or None if the TCP connection just
        ended, the events received before it)."""
        events: list[dict[str, object]] = []
        while (frame := await self.next_frame()) is not None:
            opcode, payload = frame
            if opcode == CLOSE:
                return (struct.unpack("!H", payload[:2])[0] if payload else None), events
            if opcode == TEXT:
                events.append(json.loads(payload))
            elif opcode == BINARY:
                events.append(msgpack.unpackb(payload))
        return None, events

    async def __aenter__(self) -> RawWebSocket:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stream.aclose()


def _healthy(base_url: str) -> bool:
    with urllib.request.urlopen(f"{base_url}/health", timeout=10) as response:
        return bool(response.status == 200)


async def _still_serving(base_url: str) -> None:
    """The server answers HTTP and a new WebSocket gets its session.created."""
    assert await trio.to_thread.run_sync(_healthy, base_url)
    async with await RawWebSocket.connect(base_url) as ws:
        assert (await ws.next_event())["type"] == "session.created"


@contextmanager
def traced_peak() -> Iterator[list[int]]:
    """Python memory allocated at the peak of the block, above its start: ``[bytes]``
    once the block ends."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    peak = [0]
    try:
        yield peak
    finally:
        peak[0] = tracemalloc.get_traced_memory()[1] - start
        tracemalloc.stop()


def _event_of_size(size: int, binary: bool) -> bytes:
    """An input_audio_buffer.clear event of exactly ``size`` bytes (padded event_id: over
    the event_id limit, so its answer is an error naming it)."""
    encode = (
        (lambda e: msgpack.packb(e, use_bin_type=True))
        if binary
        else (lambda e: json.dumps(e).encode())
    )
    base = len(encode({"type": "input_audio_buffer.clear", "event_id": ""}))
    pad = size - base
    for guess in (pad, pad - 1, pad - 2, pad - 4):  # msgpack's str header grows with the length
        data: bytes = encode({"type": "input_audio_buffer.clear", "event_id": "x" * guess})
        if len(data) == size:
            return data
    raise AssertionError(f"cannot build an event of {size} bytes")


# --- oversized frames -----------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
async def test_a_frame_at_the_limit_passes_and_one_byte_more_is_refused_with_1009(
    nursery: trio.Nursery, binary: bool
) -> None:
    base_url = await _server(nursery)
    opcode = BINARY if binary else TEXT
    with trio.fail_after(20):
        async with await RawWebSocket.connect(
            base_url, subprotocol=MSGPACK if binary else None
        ) as ws:
            assert (await ws.next_event())["type"] == "session.created"
            await ws.send(ws.frame(opcode, _event_of_size(LIMIT, binary)))
            # Parsed (so not refused by size): its padded event_id is over its own limit.
            error = (await ws.next_event())["error"]
            assert (error["code"], error["param"]) == ("invalid_value", "event_id")
            await ws.send(ws.frame(opcode, _event_of_size(LIMIT + 1, binary)))
            code, events = await ws.close_code()
        assert (code, events) == (MESSAGE_TOO_BIG, [])
        await _still_serving(base_url)


async def test_an_oversized_message_in_fragments_is_refused_with_1009(
    nursery: trio.Nursery,
) -> None:
    base_url = await _server(nursery)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            fragment = b" " * (8 * 1024)
            frames = [ws.frame(TEXT, fragment, fin=False)]
            frames += [ws.frame(CONTINUATION, fragment, fin=False) for _ in range(15)]
            frames.append(ws.frame(CONTINUATION, b"{}", fin=True))  # 128 KiB in all
            with trio.move_on_after(5):  # the server may stop reading once it refused
                with suppress(trio.BrokenResourceError):  # the server may hang up
                    await ws.send(b"".join(frames))
            code, events = await ws.close_code()
        assert (code, events) == (MESSAGE_TOO_BIG, [])
        await _still_serving(base_url)


async def test_an_oversized_frame_is_not_buffered(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery)
    frame = RawWebSocket.frame(TEXT, b" " * (32 * 1024 * 1024))  # 512 times the limit
    with trio.fail_after(60):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            with traced_peak() as peak:
                with trio.move_on_after(20):
                    with suppress(trio.BrokenResourceError):  # the server may hang up
                        await ws.send(frame)
                code, _ = await ws.close_code()
        await _still_serving(base_url)
    assert code == MESSAGE_TOO_BIG
    assert peak[0] < MEMORY_BOUND, f"{peak[0] / 2**20:.0f} MiB allocated for a refused frame"


async def test_the_close_handshake_after_a_1009_ends(nursery: trio.Nursery) -> None:
    # A linger far past the 3 s allowed here: only the client's close reply can end it.
    base_url = await _server(nursery, close_linger_s=60.0)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            # What a well-behaved client does: the whole message, and the close reply to
            # the 1009 as soon as it comes (here at once, so both arrive together).
            oversized = ws.frame(TEXT, b" " * (4 * LIMIT))
            with suppress(trio.BrokenResourceError):  # the server may stop reading
                await ws.send(oversized + ws.frame(CLOSE, struct.pack("!H", MESSAGE_TOO_BIG)))
            code, ended = None, False
            with trio.move_on_after(3):
                code, _ = await ws.close_code()  # the server's close frame, then EOF
                ended = await ws.next_frame() is None
        await _still_serving(base_url)
    assert code == MESSAGE_TOO_BIG
    assert ended, "the server did not close the TCP connection after the close handshake"


async def test_a_client_that_never_answers_the_1009_is_hung_up_after_the_linger(
    nursery: trio.Nursery,
) -> None:
    base_url = await _server(nursery, close_linger_s=0.5)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            await ws.send(ws.frame(TEXT, b" ", declared_length=2**40))  # never finished
            code, _ = await ws.close_code()
            closed_at = trio.current_time()
            ended = await ws.next_frame() is None  # no reply from us: the server hangs up
            waited_s = trio.current_time() - closed_at
        await _still_serving(base_url)
    assert code == MESSAGE_TOO_BIG
    assert ended
    assert 0.3 < waited_s < 3.0, waited_s


# --- lying frame headers --------------------------------------------------------------------


async def test_a_frame_declaring_a_huge_length_is_refused_at_once(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            await ws.send(ws.frame(TEXT, b'{"ty', declared_length=2**62))
            code = None
            with trio.move_on_after(3):
                code, _ = await ws.close_code()
        await _still_serving(base_url)
    assert code == MESSAGE_TOO_BIG


async def test_an_impossible_64_bit_length_fails_the_connection(nursery: trio.Nursery) -> None:
    # RFC 6455 5.2: the most significant bit of a 64-bit length must be 0.
    base_url = await _server(nursery)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            await ws.send(ws.frame(TEXT, b"{}", declared_length=2**63))
            code, events = await ws.close_code()
        assert code == PROTOCOL_ERROR
        assert events == []
        await _still_serving(base_url)


# --- compressed frames ----------------------------------------------------------------------


def _deflate(data: bytes) -> bytes:
    """``data`` as one permessage-deflate payload (RFC 7692: raw deflate, no tail)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    compressed = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert compressed.endswith(b"\x00\x00\xff\xff")
    return compressed[:-4]


@pytest.mark.parametrize("compression", ["deflate", None], ids=["deflate", "uncompressed"])
async def test_a_standard_client_gets_1009_for_16_mib(
    nursery: trio.Nursery, compression: str | None
) -> None:
    base_url = await _server(nursery)
    url = base_url.replace("http", "ws") + "/v1/realtime"

    def send_bomb() -> tuple[str, int | None]:
        # websockets offers permessage-deflate by default and, when the server accepts
        # it, compresses what it sends: 16 MiB of spaces as ~16 KB. Uncompressed, the
        # client is still sending when the 1009 comes: the server must read on (and
        # drop) until the client reads it, or the client gets a reset instead.
        # close_timeout: the 1009 is what matters here, not how soon the server closes
        # TCP after the close handshake (see test_the_close_handshake_after_a_1009_ends).
        with websockets.sync.client.connect(
            url, open_timeout=10, close_timeout=1, compression=compression, ping_interval=None
        ) as ws:
            assert ws.response is not None
            negotiated = ws.response.headers.get("Sec-WebSocket-Extensions", "")
            ws.recv(timeout=10)  # session.created
            with suppress(websockets.ConnectionClosed):
                ws.send(" " * (16 * 1024 * 1024))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                ws.recv(timeout=10)
        return negotiated, closed.value.rcvd.code if closed.value.rcvd else None

    with trio.fail_after(30):
        negotiated, code = await trio.to_thread.run_sync(send_bomb)
        assert negotiated.startswith("permessage-deflate") == (compression is not None)
        assert code == MESSAGE_TOO_BIG
        await _still_serving(base_url)


async def test_a_deflate_bomb_is_refused_before_it_is_inflated(nursery: trio.Nursery) -> None:
    base_url = await _server(nursery)
    inflated = 128 * 1024 * 1024
    bomb = _deflate(b" " * inflated)
    assert len(bomb) < inflated // 500  # ~128 KB on the wire
    frame = RawWebSocket.frame(TEXT, bomb, rsv1=True)
    with trio.fail_after(60):
        async with await RawWebSocket.connect(base_url, deflate=True) as ws:
            negotiated = ws.headers.get("sec-websocket-extensions", "")
            assert (await ws.next_event())["type"] == "session.created"
            with traced_peak() as peak:
                with trio.move_on_after(10):
                    with suppress(trio.BrokenResourceError):  # the server may hang up
                        await ws.send(frame)
                code, events = await ws.close_code()
        await _still_serving(base_url)
    assert negotiated.startswith("permessage-deflate")
    assert (code, events) == (MESSAGE_TOO_BIG, [])
    assert peak[0] < MEMORY_BOUND, f"{peak[0] / 2**20:.0f} MiB allocated for a refused frame"


async def test_a_compressed_frame_without_deflate_negotiated_fails_the_connection(
    nursery: trio.Nursery,
) -> None:
    base_url = await _server(nursery)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url, deflate=False) as ws:
            assert "sec-websocket-extensions" not in ws.headers
            await ws.next_event()
            event = _deflate(json.dumps({"type": "input_audio_buffer.clear"}).encode())
            await ws.send(ws.frame(TEXT, event, rsv1=True))
            code, events = await ws.close_code()
        # RFC 6455 5.2: RSV1 without an extension that defines it fails the connection.
        assert code == PROTOCOL_ERROR
        assert events == []  # the frame never reached the session
        await _still_serving(base_url)


@pytest.mark.parametrize(
    ("frame", "expected_code"),
    [
        # Control frames are never compressed; only a message's first frame has RSV1.
        (RawWebSocket.frame(CLOSE, b"\x03\xe8", rsv1=True), PROTOCOL_ERROR),
        (
            RawWebSocket.frame(TEXT, b"{", fin=False)
            + RawWebSocket.frame(CONTINUATION, b"}", rsv1=True),
            PROTOCOL_ERROR,
        ),
        (RawWebSocket.frame(TEXT, b"\xff\xff\xff\xff", rsv1=True), INVALID_PAYLOAD),
    ],
    ids=["compressed close", "compressed continuation", "corrupt deflate"],
)
async def test_malformed_compressed_frames_fail_only_their_connection(
    nursery: trio.Nursery, frame: bytes, expected_code: int
) -> None:
    base_url = await _server(nursery)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url, deflate=True) as ws:
            await ws.next_event()
            await ws.send(frame)
            code, events = await ws.close_code()
        assert code == expected_code
        assert events == []
        await _still_serving(base_url)


# --- hostile content in a well-formed frame -------------------------------------------------


async def test_a_huge_integer_gets_an_error_event_and_the_session_goes_on(
    nursery: trio.Nursery,
) -> None:
    base_url = await _server(nursery)
    with trio.fail_after(20):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            event = '{"type": "session.update", "session": {"temperature": 1%s}}' % ("0" * 400)
            await ws.send(ws.frame(TEXT, event.encode()))
            reply = await ws.next_frame()
        await _still_serving(base_url)
    assert reply is not None
    assert reply[0] == TEXT, reply
    error = json.loads(reply[1])
    assert error["type"] == "error"
    assert error["error"]["code"] == "invalid_value"


async def test_a_full_conversation_still_ends_its_response_and_the_session_goes_on(
    nursery: trio.Nursery,
) -> None:
    base_url = await _server(nursery)
    item = {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
        },
    }
    with trio.fail_after(30):
        async with await RawWebSocket.connect(base_url) as ws:
            await ws.next_event()
            limit = 1024  # SessionConfig.max_conversation_items, the server's default
            await ws.send(b"".join(ws.frame(TEXT, json.dumps(item).encode()) for _ in range(limit)))
            await ws.send(ws.frame(TEXT, b'{"type": "response.create"}'))
            await ws.send(ws.frame(TEXT, b'{"type": "input_audio_buffer.clear"}'))
            types: list[object] = []
            errors: list[str] = []
            with trio.move_on_after(10):
                while "input_audio_buffer.cleared" not in types:
                    frame = await ws.next_frame()
                    if frame is None or frame[0] != TEXT:
                        break
                    event = json.loads(frame[1])
                    types.append(event["type"])
                    if event["type"] == "error":
                        errors.append(event["error"]["code"])
        await _still_serving(base_url)
    # A full conversation refuses the new response with a clear error; the session goes on.
    assert errors == ["conversation_too_large"], errors
    assert "input_audio_buffer.cleared" in types, types[-5:]
