"""The frame limits of omnitrio/server/_frame_limits.py without sockets: bytes into a
wsproto connection, events out (tests/server/test_frame_limits.py runs them in the server)."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

from wsproto.connection import Connection
from wsproto.events import CloseConnection, Event, Message, Ping

from omnitrio.server._frame_limits import (
    FRAME_COST_BYTES,
    MIN_FRAMES,
    MessageLimit,
    compressed_size_bound,
    limited_connection,
)
from tests.server.test_frame_limits import BINARY, CLOSE, CONTINUATION, TEXT, RawWebSocket

LIMIT = 1000
frame = RawWebSocket.frame
PING = 0x9


def _parse(connection: Connection, data: bytes) -> list[Event]:
    connection.receive_data(data)
    return list(connection.events())


def _payloads(events: list[Event]) -> list[str | bytes]:
    return [event.data for event in events if isinstance(event, Message)]


class Deflater:
    """A client's permessage-deflate compressor (context takeover: one for the connection)."""

    def __init__(self) -> None:
        self._compressor = zlib.compressobj(9, zlib.DEFLATED, -15)

    def message(self, data: bytes) -> bytes:
        compressed = self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)
        return compressed[:-4]  # RFC 7692 7.2.1: the tail is stripped


def test_a_message_at_the_limit_passes_and_a_header_past_it_is_refused_at_once() -> None:
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, None)
    assert _payloads(_parse(connection, frame(BINARY, b"x" * LIMIT))) == [b"x" * LIMIT]
    assert not limit.refused
    header = frame(TEXT, b"", declared_length=LIMIT + 1)
    assert _parse(connection, header) == []  # no payload yet, and already refused
    assert limit.refused


def test_a_refused_message_is_dropped_and_the_parser_goes_on_to_the_close_reply() -> None:
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, None)
    reply = frame(CLOSE, struct.pack("!H", 1009))
    events = _parse(connection, frame(TEXT, b" " * (10 * LIMIT)) + reply)
    assert limit.refused
    assert "".join(str(payload) for payload in _payloads(events)) == ""  # nothing kept
    assert isinstance(events[-1], CloseConnection)
    assert events[-1].code == 1009


def test_fragments_count_towards_one_message() -> None:
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, None)
    half = b"y" * (LIMIT // 2)
    whole = frame(TEXT, half, fin=False) + frame(CONTINUATION, half)
    assert "".join(map(str, _payloads(_parse(connection, whole)))) == "y" * LIMIT
    assert not limit.refused
    events = _parse(connection, whole + frame(CONTINUATION, b"y", fin=False, declared_length=1))
    assert limit.refused  # the third fragment's header passed the limit
    assert "".join(map(str, _payloads(events))) == "y" * LIMIT


def test_compressed_messages_inflate_up_to_the_limit_with_context_takeover() -> None:
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, b"permessage-deflate")
    deflater = Deflater()
    first, second = b"a" * LIMIT, b"a" * (LIMIT // 2) + b"b" * (LIMIT // 2)
    data = frame(TEXT, deflater.message(first), rsv1=True)
    data += frame(BINARY, deflater.message(second), rsv1=True)  # refers back to the first
    assert _payloads(_parse(connection, data)) == [first.decode(), second]
    assert not limit.refused


def test_a_fragmented_compressed_message_with_a_ping_inside() -> None:
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, b"permessage-deflate; client_no_context_takeover")
    compressed = Deflater().message(b"z" * 900)
    cut = len(compressed) // 2
    data = frame(BINARY, compressed[:cut], rsv1=True, fin=False)
    data += frame(PING, b"ping")  # control frames are never compressed
    data += frame(CONTINUATION, compressed[cut:])
    events = _parse(connection, data)
    assert b"".join(p for p in _payloads(events) if isinstance(p, bytes)) == b"z" * 900
    assert [event.payload for event in events if isinstance(event, Ping)] == [b"ping"]
    # client_no_context_takeover: the next message starts a fresh inflater.
    fresh = frame(TEXT, Deflater().message(b"again"), rsv1=True)
    assert _payloads(_parse(connection, fresh)) == ["again"]


def test_one_byte_past_the_limit_inflated_is_refused() -> None:
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, b"permessage-deflate")
    events = _parse(connection, frame(TEXT, Deflater().message(b"c" * (LIMIT + 1)), rsv1=True))
    assert limit.refused
    assert sum(len(p) for p in _payloads(events)) <= LIMIT


def test_a_bomb_is_refused_after_at_most_the_limit_inflated() -> None:
    limit = MessageLimit(64 * 1024)
    connection = limited_connection(limit, b"permessage-deflate")
    bomb = frame(BINARY, Deflater().message(bytes(64 * 1024 * 1024)), rsv1=True)  # ~64 KB
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        events = _parse(connection, bomb)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert limit.refused
    assert _payloads(events) in ([], [b""])
    assert peak < 1024 * 1024, f"{peak} bytes allocated to refuse a 64 MiB bomb"


def test_a_compressed_frame_declaring_more_than_deflate_could_need_is_refused() -> None:
    allowed = compressed_size_bound(LIMIT)
    for declared, refused in ((allowed, False), (allowed + 1, True)):
        limit = MessageLimit(LIMIT)
        connection = limited_connection(limit, b"permessage-deflate")
        _parse(connection, frame(TEXT, b"", rsv1=True, declared_length=declared))
        assert limit.refused == refused


def test_endless_empty_continuation_frames_count_toward_the_limit() -> None:
    """Round 3, row 9: a text message of 0-byte continuation frames was never refused."""
    limit = MessageLimit(LIMIT)
    connection = limited_connection(limit, None)
    empty = frame(CONTINUATION, b"", fin=False)
    assert limit.max_frames == max(MIN_FRAMES, LIMIT // FRAME_COST_BYTES)
    allowed = limit.max_frames - 1  # the first frame is one
    events = _parse(connection, frame(TEXT, b"", fin=False) + empty * allowed)
    assert "".join(map(str, _payloads(events))) == ""
    assert not limit.refused
    _parse(connection, empty)
    assert limit.refused  # one more: refused, and the stream sends close 1009
    assert limit.flooded  # ... and reads no more of it (_ws_stream.py)
    honest = MessageLimit(LIMIT)  # a message in a few fragments still passes
    fragments = frame(TEXT, b"a" * 200, fin=False) + frame(CONTINUATION, b"b" * 200)
    events = _parse(limited_connection(honest, None), fragments)
    assert "".join(map(str, _payloads(events))) == "a" * 200 + "b" * 200
    assert not honest.refused
    assert not honest.flooded
