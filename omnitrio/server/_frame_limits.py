"""Inbound WebSocket messages bounded while wsproto parses them, not after.

hypercorn 0.18 counts a message only once wsproto has handed it over: a frame
header that declares 2**62 bytes is believed, an oversized frame is read to its
end into one buffer, and a permessage-deflate frame is inflated with no output
limit (64 KiB read can be 64 MiB inflated). Two wsproto extensions close that
gap; each sees every frame of the connection as it is parsed:

- ``MessageLimit`` is never negotiated: it claims no RSV bit and sends no header.
  It adds up the payload lengths that the frame headers of a message declare, and
  counts its frames (a message of endless empty continuation frames cost a parse each
  and never grew: ``FRAME_COST_BYTES``), and refuses the message as soon as either
  passes its limit, before any of that frame's payload is kept.
- ``BoundedDeflate`` is wsproto's permessage-deflate with its inbound side
  replaced: it inflates at most one byte past the limit per message, so a bomb
  costs at most ``max_message_bytes + 1`` bytes before it is refused.

A refusal is not a wsproto error (a ``ParseFailed`` stops wsproto's parser for
good, and then the client's reply to our close frame could never be read). The
refused message's payload is dropped as it arrives, ``MessageLimit.refused`` is
set, and the WebSocket stream (``_ws_stream``) sends close 1009 when it sees it.
Everything here is sans-io: bytes in, frames out, no sockets.
"""

from __future__ import annotations

import zlib

from wsproto.connection import Connection, ConnectionType
from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import CloseReason, FrameDecoder, FrameProtocol, Opcode, RsvBits

_NO_RSV_BITS = RsvBits(False, False, False)
# RFC 7692 7.2.1: the four bytes a sender strips from the end of each compressed message.
_DEFLATE_TAIL = b"\x00\x00\xff\xff"
FRAME_COST_BYTES = 128
"""A message may have one data frame per this many bytes of its limit (or ``MIN_FRAMES``):
8,192 for 1 MiB, so an honest client's 4 KiB fragments fit 32 times over."""
MIN_FRAMES = 64


def compressed_size_bound(size: int) -> int:
    """The most bytes deflate may take to encode ``size`` bytes, with room to spare.

    zlib's own bound (``deflateBound``) is size + size/4096 + size/16384 + 13;
    an honest sender never needs more than size + size/1024 + 64.
    """
    return size + size // 1024 + 64


class MessageLimit(Extension):
    """Refuses a message whose frame headers declare more than ``max_message_bytes``,
    or that has more than ``max_frames`` data frames.

    Never offered, never negotiated: it only watches. A compressed message may
    declare up to ``compressed_size_bound(max_message_bytes)`` on the wire; its
    inflated size is ``BoundedDeflate``'s to check. Once a message is refused,
    ``refused`` stays set and the payload of every later data frame is dropped:
    the connection is closing.
    """

    name = "omnitrio-message-limit"

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self.refused = False
        self.flooded = False  # refused for its number of frames
        self._wire_bytes = 0  # declared payload bytes of the message so far
        self._num_frames = 0  # data frames of the message so far
        self.max_frames = max(MIN_FRAMES, max_message_bytes // FRAME_COST_BYTES)
        self._compressed = False
        self._data_frame = False

    def enabled(self) -> bool:
        return True

    def offer(self) -> bool:
        return False

    def refuse(self) -> None:
        self.refused = True

    def frame_inbound_header(
        self,
        proto: FrameDecoder | FrameProtocol,
        opcode: Opcode,
        rsv: RsvBits,
        payload_length: int,
    ) -> CloseReason | RsvBits:
        self._data_frame = not opcode.iscontrol()  # control frames: 125 bytes at most
        if self._data_frame:
            if opcode is not Opcode.CONTINUATION:  # the first frame of a message
                self._wire_bytes, self._compressed, self._num_frames = 0, rsv.rsv1, 0
            self._wire_bytes += payload_length
            self._num_frames += 1
            if self._num_frames > self.max_frames:
                self.refused = self.flooded = True
            if self._compressed:
                allowed = compressed_size_bound(self.max_message_bytes)
            else:
                allowed = self.max_message_bytes
            if self._wire_bytes > allowed:
                self.refused = True
        return _NO_RSV_BITS

    def frame_inbound_payload_data(
        self, proto: FrameDecoder | FrameProtocol, data: bytes
    ) -> bytes | CloseReason:
        return b"" if self.refused and self._data_frame else data


class BoundedDeflate(PerMessageDeflate):
    """permessage-deflate whose inbound side inflates at most one byte past the limit.

    Negotiation and the outbound side are wsproto's. Inbound, a message's
    inflated size is counted as it is inflated; one byte past
    ``limit.max_message_bytes`` refuses it (``limit.refuse()``) and nothing more
    of the connection's data is inflated.
    """

    def __init__(self, limit: MessageLimit) -> None:
        super().__init__()
        self._limit = limit
        self._inflater: zlib._Decompress | None = None
        self._message_compressed = False
        self._frame_compressed = False
        self._inflated_bytes = 0  # of the message so far

    def frame_inbound_header(
        self,
        proto: FrameDecoder | FrameProtocol,
        opcode: Opcode,
        rsv: RsvBits,
        payload_length: int,
    ) -> CloseReason | RsvBits:
        # RFC 7692 6.1: RSV1 marks the first frame of a compressed message, nothing else.
        if rsv.rsv1 and (opcode.iscontrol() or opcode is Opcode.CONTINUATION):
            return CloseReason.PROTOCOL_ERROR
        if opcode in (Opcode.TEXT, Opcode.BINARY):
            self._message_compressed, self._inflated_bytes = rsv.rsv1, 0
        self._frame_compressed = self._message_compressed and not opcode.iscontrol()
        return RsvBits(True, False, False)

    def frame_inbound_payload_data(
        self, proto: FrameDecoder | FrameProtocol, data: bytes
    ) -> bytes | CloseReason:
        if not self._frame_compressed or self._limit.refused:
            return data
        return self._inflate(data)

    def frame_inbound_complete(
        self, proto: FrameDecoder | FrameProtocol, fin: bool
    ) -> bytes | CloseReason | None:
        if not (fin and self._frame_compressed):
            return None
        self._message_compressed = self._frame_compressed = False
        if self._limit.refused:
            return None
        tail = self._inflate(_DEFLATE_TAIL)
        if self.client_no_context_takeover:
            self._inflater = None
        return tail

    def _inflate(self, data: bytes) -> bytes | CloseReason:
        if self._inflater is None:
            self._inflater = zlib.decompressobj(-self.client_max_window_bits)
        room = self._limit.max_message_bytes - self._inflated_bytes
        try:
            # At most room + 1 bytes out; what is left stays compressed, unread.
            inflated = self._inflater.decompress(data, room + 1)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        if len(inflated) > room:
            self._limit.refuse()
            return b""
        self._inflated_bytes += len(inflated)
        return inflated


def limited_connection(limit: MessageLimit, negotiated: bytes | None) -> Connection:
    """A server-side wsproto connection that enforces ``limit``.

    ``negotiated`` is the ``Sec-WebSocket-Extensions`` value of the handshake
    response (None if none): compression is on exactly as the client was told.
    """
    extensions: list[Extension] = [limit]
    if negotiated is not None:
        accepted = negotiated.decode("ascii")
        if accepted.split(";")[0].strip() != PerMessageDeflate.name:
            raise RuntimeError(f"the handshake accepted an unknown extension: {accepted!r}")
        deflate = BoundedDeflate(limit)
        deflate.finalize(accepted)  # the parameters the client was sent
        extensions.append(deflate)
    return Connection(ConnectionType.SERVER, extensions)
