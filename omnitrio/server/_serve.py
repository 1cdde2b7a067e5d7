"""Run the server inside the pipeline's nursery, and stop both cleanly on a signal."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial

import hypercorn.protocol
import hypercorn.protocol.h2
import hypercorn.protocol.h11
import hypercorn.trio.run
import trio
from hypercorn.config import Config, Sockets
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.run import worker_serve
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import wrap_app

from .._config import PipelineConfig
from .._listen import listen_socket
from .._pipeline import open_pipeline
from ._app import create_app
from ._calls import Calls, open_calls
from ._connections import ATTRIBUTE as CONNECTIONS_ATTRIBUTE
from ._connections import ConnectionSlots, peer_of, refuse
from ._h2c import ATTRIBUTE as H2C_ATTRIBUTE
from ._h2c import H11WithoutH2c
from ._settings import ServerSettings, effective_max_connections
from ._side_stage import SideStage
from ._state import ServerState
from ._trim_after import trimming_after_big
from ._ws_stream import LINGER_ATTRIBUTE, LimitedWSStream

logger = logging.getLogger(__name__)

WRITES_ATTRIBUTE = "omnitrio_write_deadlines"


class _ContainedTCPServer(TCPServer):
    """hypercorn's per-connection task, made safe for one bad peer.

    - On the trio worker an exception in one connection's task ends ``serve()``
      for every client (hypercorn #225: a WebSocket upgrade request followed by
      extra bytes makes h11 raise while hypercorn finishes the connection). Here
      it is logged and only that connection is dropped. Cancellation passes.
    - hypercorn's close of a connection is shielded here (see ``_close``), and a
      connection whose peer has gone is not kept for the keep-alive timeout.
    - A connection past the server's limit is answered 503 and closed
      (``_connections``).
    - hypercorn writes to the socket shielded from cancellation, so a peer that
      stops reading would hold its connection task (and server shutdown) forever.
      Here a write that cannot finish within the server's send timeout drops that
      connection; the application then sees a disconnect and frees its stream.
    """

    async def run(self) -> None:
        slots: ConnectionSlots = getattr(self.config, CONNECTIONS_ATTRIBUTE)
        client = peer_of(self.stream)
        refusal = slots.take_for(client)
        if refusal is not None:
            await refuse(self.stream, refusal)
            return
        try:
            await super().run()
        except Exception:
            logger.warning("a connection failed inside the HTTP server; dropped it", exc_info=True)
        finally:
            slots.give_back_for(client)

    async def _read_data(self) -> None:
        await super()._read_data()
        # The peer closed (or reading failed): without this hypercorn's keep-alive
        # timer holds the finished connection, its fd and its slot, for
        # keep_alive_timeout (5 s) more. A response still being written goes on.
        await self.idle_task.stop()

    async def _close(self) -> None:
        # Shielded: hypercorn closes a connection (``Connection: close``, a response
        # sent before its request body was read: a 401 to a client still uploading)
        # from inside the application's task, which quart cancels as the response
        # ends, so the close was lost and the connection stayed open for as long as
        # the peer liked. Both steps are immediate (shutdown and close of the socket).
        with trio.CancelScope(shield=True):
            await super()._close()

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            # Shielded: hypercorn marks a connection idle (and starts its keep-alive
            # timer, which also ends it on a drain) from inside the application's task,
            # which quart cancels as the response ends, so the timer never started and
            # an idle keep-alive connection stayed open until the peer or the hard stop
            # closed it. Starting the timer is immediate.
            with trio.CancelScope(shield=True):
                await super().protocol_send(event)
            return
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        writes: _WriteDeadlines = getattr(self.config, WRITES_ATTRIBUTE)
        async with self.send_lock:
            # Shielded like hypercorn's own write, but with a deadline of its own.
            stalled = writes.scope()
            writes.track(stalled)
            try:
                with stalled:
                    await self.stream.send_all(event.data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
                return
            finally:
                writes.untrack(stalled)
        if stalled.cancelled_caught:
            logger.info("a peer is not reading (or the server is stopping); dropping it")
            await self.stream.aclose()
            await self.protocol.handle(Closed())


hypercorn.trio.run.TCPServer = _ContainedTCPServer  # type: ignore[attr-defined]
# h2c only when the settings turn it on (``_h2c``).
hypercorn.protocol.H11Protocol = H11WithoutH2c  # type: ignore[attr-defined]
# WebSocket messages bounded while they are parsed (hypercorn counts them afterwards).
hypercorn.protocol.h11.WSStream = LimitedWSStream  # type: ignore[attr-defined]
hypercorn.protocol.h2.WSStream = LimitedWSStream  # type: ignore[attr-defined]


async def serve(
    config: PipelineConfig | str | os.PathLike[str],
    settings: ServerSettings,
    *,
    sockets: Sequence[socket.socket] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> int | None:
    """Serve until SIGINT/SIGTERM (returned) or cancellation.

    The port is bound first (a taken port is a ``BindError`` at once, before any
    stage loads), unless the caller bound it already (``sockets``, from
    ``bound_sockets``: the CLI binds before it even reads the config, whose stage
    modules it imports); then the pipeline starts (its stages load), the server starts
    accepting and ``task_status.started()`` reports its URLs (an empty list if a signal came
    first: a signal while stages load stops the loading at once). On a signal
    the server stops accepting, in-flight work gets ``grace_period_s`` to finish
    (a second signal ends it at once), then everything left — socket writes to
    clients that stopped reading included — is cut, the server closes and the
    pipeline stops.
    """
    stopped_by: int | None = None
    stop = trio.Event()
    writes = _WriteDeadlines(settings.send_timeout_s)
    states: list[ServerState] = []
    started = False
    hyper = _hypercorn_config(settings, writes)
    with (
        nullcontext(sockets) if sockets is not None else bound_sockets(settings) as listening,
        trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
    ):
        async with trio.open_nursery() as outer:

            async def on_signal() -> None:
                nonlocal stopped_by
                async for signum in signals:
                    if stopped_by is not None:  # a second signal: the grace period ends now
                        logger.info("second %s: stopping now", signal.Signals(signum).name)
                        outer.cancel_scope.deadline = trio.current_time()
                        writes.stop_by(trio.current_time())
                        return
                    stopped_by = signum
                    stop.set()
                    if not states:  # still loading: nothing in flight to wait for
                        outer.cancel_scope.cancel()
                    for state in states:  # idle sessions and calls end now
                        state.drain()
                        if isinstance(state.calls, Calls):
                            state.calls.drain()
                    hard_stop_at = trio.current_time() + settings.grace_period_s
                    outer.cancel_scope.deadline = hard_stop_at
                    writes.stop_by(hard_stop_at)

            outer.start_soon(on_signal)
            async with open_pipeline(config) as pipeline:
                state = ServerState(pipeline, settings, side_stage=SideStage.of(pipeline))
                getattr(hyper, CONNECTIONS_ATTRIBUTE).on_crowded = state.idle_sessions.set_crowded
                states.append(state)
                trimming = trimming_after_big(create_app(state), state.heap_trims)
                app = wrap_app(trimming, hyper.wsgi_max_body_size, "asgi")
                listening_sockets = Sockets([], list(listening), [])
                serve_http = partial(worker_serve, app, hyper, sockets=listening_sockets)
                # WebRTC calls outlive the requests that made them: on a signal each ends
                # once quiet (an answer under way goes out first, within the grace period;
                # _calls.py), then the calls close (each within its close timeout) once the
                # HTTP server has stopped, before the pipeline; then the shares' decoder
                # processes end.
                async with state.shares, open_calls(state) as calls:
                    state.calls = calls
                    async with trio.open_nursery() as server:  # ends before the pipeline does
                        serving = partial(serve_http, shutdown_trigger=stop.wait)
                        binds = await server.start(serving)
                        task_status.started(binds)
                        started = True
            outer.cancel_scope.cancel()
    if not started:
        task_status.started([])
    return stopped_by


@contextmanager
def bound_sockets(settings: ServerSettings) -> Iterator[list[socket.socket]]:
    """A socket listening on ``settings.host:port`` (for ``serve``), closed on leaving.

    Raises ``BindError`` (one line naming host:port) when the address is taken."""
    sock = listen_socket(settings.host, settings.port)
    with sock:
        yield [sock]


class _WriteDeadlines:
    """The deadlines of socket writes in progress; a shutdown pulls them in."""

    def __init__(self, send_timeout_s: float) -> None:
        self.send_timeout_s = send_timeout_s
        self._hard_stop_at = math.inf
        self._scopes: set[trio.CancelScope] = set()

    def scope(self) -> trio.CancelScope:
        """A shielded scope for one write: cancelled only by its own deadline."""
        deadline = min(trio.current_time() + self.send_timeout_s, self._hard_stop_at)
        return trio.CancelScope(shield=True, deadline=deadline)

    def track(self, scope: trio.CancelScope) -> None:
        self._scopes.add(scope)

    def untrack(self, scope: trio.CancelScope) -> None:
        self._scopes.discard(scope)

    def stop_by(self, when: float) -> None:
        self._hard_stop_at = when
        for scope in self._scopes:
            scope.deadline = min(scope.deadline, when)


def _hypercorn_config(settings: ServerSettings, writes: _WriteDeadlines) -> Config:
    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.websocket_max_message_size = settings.max_message_bytes
    config.graceful_timeout = settings.grace_period_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    setattr(config, WRITES_ATTRIBUTE, writes)
    setattr(config, LINGER_ATTRIBUTE, settings.close_linger_s)
    setattr(config, H2C_ATTRIBUTE, settings.h2c)
    slots = ConnectionSlots(
        effective_max_connections(settings), settings.max_connections_per_client
    )
    setattr(config, CONNECTIONS_ATTRIBUTE, slots)
    return config
