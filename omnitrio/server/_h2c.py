"""HTTP/2 over cleartext (h2c), off unless ``ServerSettings.h2c`` turns it on.

hypercorn speaks h2c to any client that asks (``Upgrade: h2c`` or the HTTP/2
preface). Its HTTP/2 stack queues a response's data for a stream whose
flow-control window the peer keeps at zero, without bound and without a write
that could time out: a client that opens 64 streaming chats on one connection
and never reads makes the server buffer every answer whole (RSS 70 -> 377 MB for
one connection), which the per-write send deadline that drops slow HTTP/1.1
readers cannot see. Browsers and the OpenAI SDKs use HTTP/1.1 on cleartext, so
h2c is off by default: an ``Upgrade: h2c`` header is ignored (the answer is
HTTP/1.1, as RFC 9110 allows) and the HTTP/2 preface gets a 505 naming the
reason, then the connection closes.
"""

from __future__ import annotations

import h11
from hypercorn.events import Closed
from hypercorn.protocol.h11 import H11Protocol

ATTRIBUTE = "omnitrio_h2c"
_REFUSAL = b"HTTP/2 over cleartext (h2c) is off on this server; use HTTP/1.1\n"


class H11WithoutH2c(H11Protocol):
    """hypercorn's HTTP/1.1 protocol that hands over to HTTP/2 only when h2c is on."""

    _refused = False

    async def _check_protocol(self, event: h11.Request) -> None:
        if getattr(self.config, ATTRIBUTE):
            await super()._check_protocol(event)
        elif event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            self._refused = True
            headers = [
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(_REFUSAL)).encode()),
                (b"connection", b"close"),
            ]
            await self._send_h11_event(h11.Response(status_code=505, headers=headers))
            await self._send_h11_event(h11.Data(data=_REFUSAL))
            await self._send_h11_event(h11.EndOfMessage())
            await self.send(Closed())
        # else: an ``Upgrade: h2c`` header is ignored; the request is served in HTTP/1.1

    async def _create_stream(self, request: h11.Request) -> None:
        if not self._refused:
            await super()._create_stream(request)
