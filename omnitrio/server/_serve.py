"""Run the server inside the pipeline's nursery, and stop both cleanly on a signal."""

from __future__ import annotations

import logging
import os
import signal
from functools import partial

import hypercorn.trio.run
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.tcp_server import TCPServer

from .._config import PipelineConfig
from .._pipeline import open_pipeline
from ._app import create_app
from ._settings import ServerSettings
from ._state import ServerState

logger = logging.getLogger(__name__)

SEND_TIMEOUT_ATTRIBUTE = "omnitrio_send_timeout_s"


class _ContainedTCPServer(TCPServer):
    """hypercorn's per-connection task, made safe for one bad peer.

    - On the trio worker an exception in one connection's task ends ``serve()``
      for every client (hypercorn #225: a WebSocket upgrade request followed by
      extra bytes makes h11 raise while hypercorn finishes the connection). Here
      it is logged and only that connection is dropped. Cancellation passes.
    - hypercorn writes to the socket shielded from cancellation, so a peer that
      stops reading would hold its connection task (and server shutdown) forever.
      Here a write that cannot finish within the server's send timeout drops that
      connection; the application then sees a disconnect and frees its stream.
    """

    async def run(self) -> None:
        try:
            await super().run()
        except Exception:
            logger.warning("a connection failed inside the HTTP server; dropped it", exc_info=True)

    async def protocol_send(self, event: Event) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        timeout_s: float = getattr(self.config, SEND_TIMEOUT_ATTRIBUTE, 10.0)
        async with self.send_lock:
            try:
                # Shielded like hypercorn's own write, but with a deadline of its own.
                with trio.CancelScope(shield=True), trio.move_on_after(timeout_s) as stalled:
                    await self.stream.send_all(event.data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
                return
        if stalled.cancelled_caught:
            logger.info("peer read nothing for %.1f s; dropping its connection", timeout_s)
            await self.stream.aclose()
            await self.protocol.handle(Closed())


hypercorn.trio.run.TCPServer = _ContainedTCPServer  # type: ignore[attr-defined]


async def serve(
    config: PipelineConfig | str | os.PathLike[str],
    settings: ServerSettings,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> int | None:
    """Serve until SIGINT/SIGTERM (returned) or cancellation.

    The pipeline starts first (its stages load); then the server binds and
    ``task_status.started()`` reports its URLs. On a signal the server stops
    accepting, in-flight work gets ``grace_period_s`` to finish, then the rest is
    cancelled, the server closes and the pipeline stops.
    """
    stopped_by: int | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_pipeline(config) as pipeline:
            state = ServerState(pipeline, settings)
            app = create_app(state)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:

                async def on_signal() -> None:
                    nonlocal stopped_by
                    async for signum in signals:
                        stopped_by = signum
                        state.draining = True
                        stop.set()
                        nursery.cancel_scope.deadline = (
                            trio.current_time() + settings.grace_period_s
                        )
                        return

                nursery.start_soon(on_signal)
                hyper = _hypercorn_config(settings)
                binds = await nursery.start(
                    partial(hypercorn_serve, app, hyper, shutdown_trigger=stop.wait)
                )
                task_status.started(binds)
                await stop.wait()
    return stopped_by


def _hypercorn_config(settings: ServerSettings) -> Config:
    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.websocket_max_message_size = settings.max_message_bytes
    config.graceful_timeout = settings.grace_period_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    setattr(config, SEND_TIMEOUT_ATTRIBUTE, settings.send_timeout_s)
    return config
