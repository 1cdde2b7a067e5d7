"""WebRTC calls (``POST /v1/realtime/calls``): each call a Realtime session whose events
ride the ``oai-events`` data channel and whose audio rides the tracks.

``Calls`` holds the calls of one server: a nursery of its own (opened by ``serve``
around the HTTP server) runs each call's task, which outlives the HTTP request that
made it. A call's task waits for the peer to connect (``connect_timeout_s``; a call
that never connects, or whose ICE/DTLS fails, is released), then runs the same
``RealtimeConnection`` a WebSocket gets, with the call's ``CallLink`` as transport and
media, until the peer goes (the connection closes or fails, the data channel closes,
or no audio for ``media_timeout_s``), ``hang_up`` is asked, or the server stops. On
leaving, the peer connection is closed (at most ``CLOSE_TIMEOUT_S``) and every stream
the session held is already freed by the connection's nursery. A call counts among
its API key's sessions (``max_sessions_per_key``) from its answer to its end.

A draining server (``drain``, on a signal) takes no new call (a 503 saying it drains,
as a new WebSocket session is refused) and ends each live one once it is quiet: an idle
call at once, one whose answer is under way once that answer's ``response.done`` and
its audio have gone out (``RealtimeConnection.end_when_quiet``); such a call's events
channel is closed the orderly way first, so its last events reach the caller. What is
left at the server's hard stop (the grace period) is cancelled.

aiortc is the ``webrtc`` extra: without it ``create`` refuses with a 501.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ..realtime import ClientEventError, RealtimeSession, new_id
from ._api_errors import Refused, busy_error
from ._client_totals import SessionRefused, SessionTotals
from ._realtime import RealtimeConnection, session_config

if TYPE_CHECKING:
    from ..webrtc import AsyncioThread, CallLink
    from ._state import ServerState

logger = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024
CLOSE_TIMEOUT_S = 1.0
FLUSH_TIMEOUT_S = 0.5
"""Of the close: a call whose session ended waits this long at most for the caller to
close the events channel (its last events delivered) before the peer connection closes."""
ANSWER_TIMEOUT_S = 5.0
"""Taking an offer and gathering this side's candidates (host candidates only)."""


@dataclass
class _Call:
    call_id: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    connection: RealtimeConnection | None = None  # once the peer has connected
    cut_because: str = "hung up"  # what cancelled ``scope``


class Calls:
    """The server's WebRTC calls (see the module docstring)."""

    def __init__(self, state: ServerState, nursery: trio.Nursery) -> None:
        self._state = state
        self._nursery = nursery
        self._bridge: AsyncioThread | None = None
        self._calls: dict[str, _Call] = {}
        self._draining = False

    def __len__(self) -> int:
        return len(self._calls)

    async def create(
        self, offer: str, session: object | None, beta: bool, client: str, secret: object | None
    ) -> tuple[str, str]:
        """Answer ``offer`` and start the call: (call id, SDP answer). ``Refused`` when
        it is refused (busy, bad SDP, a bad session object, no aiortc)."""
        state, settings = self._state, self._state.settings
        reason = state.busy()
        if reason is not None:
            raise Refused.of(busy_error(state.refuse(reason)))
        if len(self._calls) >= settings.max_calls:
            state.refusals.labels("calls").inc()
            message = f"the server has {settings.max_calls} calls up (max_calls); retry later"
            raise Refused(503, message, "too_many_calls")
        _check_offer(offer)
        realtime = _configured(state, beta, secret, session)
        of_key = _of_key(state, client)
        try:
            link, answer = await self._answer(offer, realtime)
            if state.draining:  # the drain began while the offer was answered
                await self._close_peer(link)
                raise Refused.of(busy_error(state.refuse("draining")))
        except BaseException:
            of_key.close()
            raise
        call = _Call(new_id("rtc"))
        self._calls[call.call_id] = call
        state.calls_started.inc()
        has_channel = "m=application" in offer
        self._nursery.start_soon(self._run, call, link, realtime, client, has_channel, of_key)
        return call.call_id, answer

    async def _answer(self, offer: str, realtime: RealtimeSession) -> tuple[CallLink, str]:
        """The call's link and this side's SDP answer; ``Refused`` when it cannot be."""
        settings = self._state.settings
        bridge = self._start_bridge()
        from ..webrtc import CallLink

        link = CallLink(
            bridge,
            settings.webrtc_playout_s,
            realtime.config.input_sample_rate_hz,
            settings.webrtc_media_timeout_s,
            settings.webrtc_input_prefetch_frames,
        )
        try:
            with trio.fail_after(ANSWER_TIMEOUT_S):
                return link, await bridge.run(link.peer.answer, offer)
        except trio.TooSlowError:
            await self._close_peer(link)
            raise Refused(503, "could not answer the offer in time", "answer_timeout") from None
        except Exception as exc:  # aiortc's parser: ValueError and a few others
            await self._close_peer(link)
            message = f"sdp: not a usable WebRTC offer ({exc})"[:300]
            raise Refused(400, message, "invalid_offer", "sdp") from None

    def hang_up(self, call_id: str) -> bool:
        """End the call (its release goes on in the background); False: no such call."""
        call = self._calls.get(call_id)
        if call is None:
            return False
        call.scope.cancel()
        return True

    def drain(self) -> None:
        """The server drains: each call ends once it is quiet (see the module docstring),
        one not yet connected at once; so does each call connected from now on."""
        self._draining = True
        for call in self._calls.values():
            self._end_when_quiet(call)

    def _end_when_quiet(self, call: _Call) -> None:
        if call.connection is None:
            call.cut_because = "the server stopped before it connected"
            call.scope.cancel()
        else:
            call.connection.end_when_quiet()

    async def wait_ended(self) -> None:
        """Until every call has ended (and released its peer)."""
        while self._calls:
            await next(iter(self._calls.values())).done.wait()

    def _start_bridge(self) -> AsyncioThread:
        if self._bridge is None:
            try:
                from ..webrtc import AsyncioThread
            except ImportError:
                message = "WebRTC calls need the webrtc extra: pip install 'omnitrio[webrtc]'"
                raise Refused(501, message, "webrtc_not_installed") from None
            from ..webrtc import use_host_addresses

            use_host_addresses(media_addresses(self._state.settings.host))
            self._bridge = AsyncioThread()
            self._bridge.start()
        return self._bridge

    async def _run(
        self,
        call: _Call,
        link: CallLink,
        session: RealtimeSession,
        client: str,
        has_channel: bool,
        of_key: SessionTotals,
    ) -> None:
        from ..webrtc import PeerGone

        settings = self._state.settings
        assert self._bridge is not None
        why, flush_s = "the server stopped", 0.0
        try:
            with call.scope:
                with trio.move_on_after(settings.webrtc_connect_timeout_s) as connecting:
                    await self._bridge.run(link.peer.wait_connected, has_channel)
                if connecting.cancelled_caught:
                    why = f"never connected within {settings.webrtc_connect_timeout_s:g} s"
                    return
                logger.info("call %s connected", call.call_id)
                connection = RealtimeConnection(self._state, link, session, client, media=link)
                call.connection = connection
                if self._draining:
                    connection.end_when_quiet()
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._watch, link, nursery.cancel_scope)
                        await connection.run()
                        why = "the server drained it" if self._draining else "its session ended"
                        flush_s = FLUSH_TIMEOUT_S
                        nursery.cancel_scope.cancel()
                except* PeerGone as gone:
                    why = str(gone.exceptions[0]) or "the peer went away"
                if link.peer.why_ended:
                    why = link.peer.why_ended
        finally:
            if call.scope.cancelled_caught:
                why = call.cut_because
            of_key.close()
            await self._close_peer(link, flush_s)
            del self._calls[call.call_id]
            call.done.set()
            logger.info("call %s ended: %s", call.call_id, why)

    async def _watch(self, link: CallLink, scope: trio.CancelScope) -> None:
        assert self._bridge is not None
        await self._bridge.run(link.peer.wait_ended)
        scope.cancel()

    async def _close_peer(self, link: CallLink, flush_s: float = 0.0) -> None:
        if self._bridge is None:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_TIMEOUT_S):
            try:
                await self._bridge.run(link.peer.close, flush_s)
            except Exception:
                logger.warning("closing a call's peer connection failed", exc_info=True)

    async def close(self) -> None:
        """End every call and stop aiortc's thread."""
        for call in list(self._calls.values()):
            call.cut_because = "the server stopped"
            call.scope.cancel()
        for call in list(self._calls.values()):
            await call.done.wait()
        if self._bridge is not None:
            await self._bridge.stop()


def _of_key(state: ServerState, client: str) -> SessionTotals:
    """The call's place among the API key's sessions until it ends: a call made with the
    key, or with a client secret the key bought, is one of them, as a WebSocket session
    is (``max_sessions_per_key``; ``_client_totals.py``). ``Refused`` 429 past it. (What
    the call's session holds is counted by its ``RealtimeConnection``.)"""
    try:
        return state.totals.open_session(client, state.settings.api_key)
    except SessionRefused as refused:
        raise Refused(
            429, str(refused), "too_many_sessions", retry_after_s=refused.retry_after_s
        ) from None


def _configured(
    state: ServerState, beta: bool, secret: object | None, session: object | None
) -> RealtimeSession:
    """A call's session, set up from its client secret's session object, then the
    call's own (``Refused`` naming the field refused)."""
    realtime = RealtimeSession(session_config(state, "json", beta, webrtc=True))
    for obj, param in ((secret, "client_secret.session"), (session, "session")):
        if obj is None:
            continue
        try:
            realtime.configure(obj)
        except ClientEventError as exc:
            raise Refused(400, f"{param}: {exc.message}", exc.code, exc.param) from None
    return realtime


def session_shown(state: ServerState, session: object | None) -> object:
    """The session object a call made with ``session`` starts with (as session.created
    shows it); ``Refused`` naming a field it refuses."""
    created = _configured(state, False, None, session).start()[0]
    return created.fields["session"]


def media_addresses(host: str) -> list[str] | None:
    """Where calls' media listens: the HTTP server's own address when it is bound to one
    (a loopback server keeps its calls on loopback), else every interface (None)."""
    if host in ("", "0.0.0.0", "::"):
        return None
    return ["127.0.0.1"] if host == "localhost" else [host]


def _check_offer(offer: str) -> None:
    if len(offer.encode()) > MAX_SDP_BYTES:
        raise Refused(400, f"sdp: the offer is over {MAX_SDP_BYTES} bytes", "invalid_offer", "sdp")
    if not offer.startswith("v=0"):
        message = "sdp: not an SDP offer (it must start with v=0); send the RTCPeerConnection's"
        raise Refused(400, f"{message} offer.sdp", "invalid_offer", "sdp")
    if "\nm=audio " not in offer.replace("\r\n", "\n"):
        message = "sdp: the offer has no audio (m=audio); add a microphone track or an audio"
        raise Refused(400, f"{message} transceiver", "offer_without_audio", "sdp")


@asynccontextmanager
async def open_calls(state: ServerState) -> AsyncIterator[Calls]:
    """The server's calls, for as long as it serves. Leaving drains them (``drain``;
    ``serve`` began it already at its signal) and waits for them to end, within the
    server's hard stop (its cancel scope's deadline, the grace period); leaving on an
    error or a cancellation, or at that deadline, ends every call at once."""
    async with trio.open_nursery() as nursery:
        calls = Calls(state, nursery)
        try:
            yield calls
            calls.drain()
            await calls.wait_ended()
        finally:
            with trio.CancelScope(
                shield=True, deadline=trio.current_time() + 2 * CLOSE_TIMEOUT_S + 1
            ):
                await calls.close()
