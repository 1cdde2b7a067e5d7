"""The Ray instance a pipeline with ``placement: ray`` stages runs on; imported only
by such pipelines. Joining or starting it is here; the stages' actors are
``_ray.py``'s.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TypeVar

import ray
import trio

from ._config import PipelineConfig
from ._errors import ConfigError
from ._worker import WorkerThread

logger = logging.getLogger(__name__)

T = TypeVar("T")

RAY_THREAD_STOP_TIMEOUT_S = 5.0
"""How long the connection's thread may take to end once Ray is shut down (it is idle
then; the bound only keeps a wedged ``ray.shutdown`` from holding teardown forever)."""

RAY_CONNECT_TIMEOUT_S = 10.0
"""How long ``pipeline.ray_address`` may take to accept a connection (Ray's own
client would retry for minutes)."""


class _Instance:
    """The Ray connection omnitrio made, shared by the pipelines of this process.

    ``ray.init`` and ``ray.shutdown`` run on one thread of omnitrio's own that lives
    as long as the connection (``thread``), never on one of trio's cached worker
    threads: a local instance's processes (GCS, raylet) are started with
    ``PR_SET_PDEATHSIG``, so the kernel kills them when the *thread* that started
    them exits, and trio ends a cached thread after 10 s without work. Beside a
    busy CPU the stages took longer than that to be placed, and the whole instance
    died under the pipeline ("Failed to connect to GCS").
    """

    lock = trio.Lock()
    num_users = 0
    thread: WorkerThread | None = None


async def _on_ray_thread(call: Callable[[], T]) -> T:
    """Run ``call`` on the connection's own thread (started if need be), and wait for it.

    The wait is shielded: ``ray.init`` and ``ray.shutdown`` cannot be interrupted, and
    a caller that left while one still ran would leave a connection nobody shuts down.
    """
    if _Instance.thread is None:
        _Instance.thread = WorkerThread("omnitrio-ray")
    thread = _Instance.thread
    with trio.CancelScope(shield=True):
        result = await thread.run(call)
    return result


async def _close_ray_thread() -> None:
    """End the connection's thread (Ray is shut down, or never came up)."""
    thread, _Instance.thread = _Instance.thread, None
    if thread is not None and not await thread.stop(
        trio.current_time() + RAY_THREAD_STOP_TIMEOUT_S
    ):
        logger.warning(
            "the Ray connection's thread did not end in %.0f s", RAY_THREAD_STOP_TIMEOUT_S
        )


@asynccontextmanager
async def open_ray(config: PipelineConfig) -> AsyncIterator[None]:
    """Ray for the pipeline's lifetime: join ``pipeline.ray_address``, or start a local
    instance; once the last pipeline using it is done, disconnect (a local instance
    stops). If this process connected to Ray itself (its own ``ray.init``), the pipeline
    uses that connection and leaves it as it found it."""
    async with _Instance.lock:
        if ray.is_initialized() and _Instance.num_users == 0:
            owned = False  # someone else's connection
        else:
            owned = True
            if _Instance.num_users == 0:
                await _connect(config)
            _Instance.num_users += 1
    try:
        yield
    finally:
        if owned:
            with trio.CancelScope(shield=True):
                async with _Instance.lock:
                    _Instance.num_users -= 1
                    if _Instance.num_users == 0:
                        try:
                            await _on_ray_thread(ray.shutdown)
                        finally:
                            await _close_ray_thread()


async def _connect(config: PipelineConfig) -> None:
    address = config.pipeline.ray_address
    logger.info("starting Ray (%s)", address or "a local instance")
    if address is not None:
        await _check_reachable(config, address)
    init = partial(
        ray.init,
        address=address,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=True,
    )
    try:
        await _on_ray_thread(init)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _close_ray_thread()
        raise
    _take_back_stop_signals()


def _take_back_stop_signals() -> None:
    """Give SIGINT and SIGTERM back to Python's handlers (trio's, the CLI's).

    Connecting installs Ray's C++ failure handler (abseil's) over them: a SIGTERM then
    went through a crash report ("*** SIGTERM received ***") before reaching Python, and
    once in a loaded CI run the process aborted (exit -6) instead of stopping the
    pipeline. Python still records its own handlers; setting them again (main thread
    only) puts them back in front."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None:
            signal.signal(signum, handler)


async def _check_reachable(config: PipelineConfig, address: str) -> None:
    """A ``host:port`` address must accept a connection (``auto`` and ``ray://`` are
    Ray's to resolve)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or "://" in host:
        return
    try:
        with trio.fail_after(RAY_CONNECT_TIMEOUT_S):
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.aclose()
    except (OSError, trio.TooSlowError) as exc:
        problem = f"no Ray cluster answers at {address} ({exc or 'timed out'})"
        raise ConfigError(
            config.source,
            "pipeline.ray_address",
            f"{problem}; start one (ray start --head) or fix the address",
        ) from None
