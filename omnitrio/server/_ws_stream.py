"""hypercorn's WebSocket stream, with messages bounded as they are parsed and a close
handshake that ends.

What changes against hypercorn 0.18's ``WSStream``:

- The wsproto connection enforces ``max_message_bytes`` inside the frame parser
  (``_frame_limits``): an oversized or lying frame is refused at its header, a
  compressed one as soon as its inflated size passes the limit; nothing past the
  limit is buffered or inflated.
- A refusal sends close 1009 and keeps parsing, dropping data frames, so the
  client's close reply is read and the TCP connection closes as soon as it comes
  (hypercorn ``break``s out of wsproto's event loop instead, and a reply that
  arrived in the same read is never parsed).
- When wsproto fails the connection (a protocol error), the peer gets a close
  frame with wsproto's code (hypercorn sends none); what follows is discarded
  unread, since wsproto's parser has stopped.
- Messages for the application are dropped once it has returned. hypercorn hands
  them over through a bounded channel that nobody reads after the application
  ends (and that is never closed), so a client that kept sending while the
  application closed it (1008, a slow reader) left the connection's reader task
  blocked in that hand-over for good, with its full buffers, unaffected by the
  client going away.
- After either close frame the connection lingers, reading and discarding,
  until the peer closes or ``close_linger_s`` passes: hanging up on a peer that
  is still sending makes the kernel reset the connection, and a reset can drop
  the close frame before the peer reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

import trio
from hypercorn.protocol.events import Body, Data, Event, Request, StreamClosed
from hypercorn.protocol.ws_stream import Handshake, WSStream
from hypercorn.typing import WebsocketAcceptEvent, WebsocketScope
from wsproto.connection import Connection, ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from ._frame_limits import MessageLimit, limited_connection

logger = logging.getLogger(__name__)

LINGER_ATTRIBUTE = "omnitrio_close_linger_s"


class LimitedWSStream(WSStream):
    """One WebSocket connection (hypercorn makes one per upgrade request)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limit = MessageLimit(self.config.websocket_max_message_size)
        self._linger_s: float = getattr(self.config, LINGER_ATTRIBUTE)
        self._parser_stopped = False  # wsproto failed the connection
        self._linger: trio.CancelScope | None = None
        self._app_returned = False
        self._puts: set[trio.CancelScope] = set()  # hand-overs to the app in progress

    async def handle(self, event: Event) -> None:
        if isinstance(event, (Body, Data)) and self._parser_stopped:
            return  # discarded unread: wsproto's parser has stopped
        if isinstance(event, StreamClosed) and self._linger is not None:
            self._linger.cancel()
        await super().handle(event)
        if isinstance(event, Request) and self.app_put is not None:
            self.app_put = partial(self._put_to_app, self.app_put)

    async def _put_to_app(self, put: Callable[[Any], Awaitable[None]], message: Any) -> None:
        """hypercorn's hand-over to the app, given up once the app has returned."""
        if self._app_returned:
            return
        # hypercorn's put is its app channel's ``send``: where the channel has room (the
        # app keeps up: every 20 ms audio append of a live session), hand the message
        # over without a cancel scope and the two checkpoints of ``send``.
        channel = getattr(put, "__self__", None)
        if isinstance(channel, trio.MemorySendChannel):
            try:
                channel.send_nowait(message)
                return
            except trio.WouldBlock:
                pass  # full: wait below, as hypercorn would, until the app takes it
        with trio.CancelScope() as scope:
            self._puts.add(scope)
            try:
                await put(message)
            finally:
                self._puts.discard(scope)

    async def app_send(self, message: Any) -> None:
        if message is None:  # the app has returned: nothing will read what it was sent
            self._app_returned = True
            for scope in self._puts:
                scope.cancel()
        await super().app_send(message)

    async def _accept(self, message: WebsocketAcceptEvent) -> None:
        # hypercorn's Handshake.accept negotiates compression and builds the wsproto
        # connection; this one builds ours from the same request, before the 101 is sent.
        self.handshake = _LimitedHandshake(self.scope, self._limit)
        await super()._accept(message)

    async def _handle_events(self) -> None:
        for event in self.connection.events():
            if self._limit.refused:
                await self._refuse()
                if self._parser_stopped:
                    return  # a flood of frames: the rest is discarded unread
            if isinstance(event, Message):
                if self.connection.state is not ConnectionState.OPEN:
                    continue  # we sent a close frame: nothing more reaches the app
                self.buffer.extend(event)  # never past the limit: MessageLimit refused first
                if event.message_finished:
                    assert self.app_put is not None  # set before the app could accept
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, CloseConnection):
                await self._on_close(event)
        if self._limit.refused:  # a header alone (no payload yet) can be refused
            await self._refuse()

    async def _on_close(self, event: CloseConnection) -> None:
        state = self.connection.state
        if state is ConnectionState.REMOTE_CLOSING:  # the peer closes: answer, hang up
            await self._send_wsproto_event(event.response())
            await self.send(StreamClosed(stream_id=self.stream_id))
        elif state is ConnectionState.CLOSED:  # the peer answered our close
            await self.send(StreamClosed(stream_id=self.stream_id))
        else:  # still OPEN or LOCAL_CLOSING: wsproto failed the connection
            self._parser_stopped = True
            logger.info(
                "closing a WebSocket from %s: %s (%d)", _peer(self.client), event.reason, event.code
            )
            await self._close_and_linger(event.code, event.reason)

    async def _refuse(self) -> None:
        if self._linger is not None:
            return  # refused already
        # A message of too many frames: what the peer sends on is discarded unread while
        # the connection lingers (its close reply too): an endless flood of empty frames
        # parsed one by one held the event loop for the whole linger (issue 42).
        self._parser_stopped = self._limit.flooded
        limit = self._limit.max_message_bytes
        logger.info("refused a WebSocket message over %d bytes from %s", limit, _peer(self.client))
        reason = f"message over the limit of {limit} bytes"
        await self._close_and_linger(CloseReason.MESSAGE_TOO_BIG, reason)

    async def _close_and_linger(self, code: int, reason: str | None) -> None:
        self.buffer.clear()
        if self.connection.state is ConnectionState.OPEN:
            await self._send_wsproto_event(CloseConnection(code=code, reason=reason))
        if self._linger is None:
            self._linger = trio.CancelScope(deadline=trio.current_time() + self._linger_s)
            self.task_group.spawn(self._hang_up_after_linger, self._linger)

    async def _hang_up_after_linger(self, linger: trio.CancelScope) -> None:
        """Close the TCP connection when ``linger``'s deadline passes (it is cancelled
        when the connection closes first)."""
        with linger:
            await trio.sleep_forever()
        if not self.closed:
            await self.send(StreamClosed(stream_id=self.stream_id))


class _LimitedHandshake(Handshake):
    def __init__(self, scope: WebsocketScope, limit: MessageLimit) -> None:
        super().__init__(list(scope["headers"]), scope["http_version"])
        self._limit = limit

    def accept(
        self, subprotocol: str | None, additional_headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[int, list[tuple[bytes, bytes]], Connection]:
        status_code, headers, _ = super().accept(subprotocol, additional_headers)
        negotiated = next((v for n, v in headers if n == b"sec-websocket-extensions"), None)
        return status_code, headers, limited_connection(self._limit, negotiated)


def _peer(client: tuple[str, int] | None) -> str:
    return "an unknown peer" if client is None else f"{client[0]}:{client[1]}"
