"""What hostile WebSocket frames cost the server (issue 7, security checks).

    python benchmarks/reliability/hostile_frames.py [--stock] [--limit-kib 64] [--runs 5]
        [--linger-s 2]

Starts the server in-process on a synthetic pipeline (as tests/server/test_frame_limits.py
does, ``max_message_bytes`` = ``--limit-kib``) and sends, one connection each:

oversized   one 32 MiB text frame, then the close reply to the 1009
bomb        a permessage-deflate frame of ~128 KB that inflates to 128 MiB
declared    a frame header declaring 2**62 bytes, then 4 bytes, then silence
handshake   a 256 KiB frame and the close reply in one write
websockets  16 MiB from the ``websockets`` client, with and without deflate
            (``--runs`` times each; the 1009 must reach it every time)

For each: the close code the client read, seconds from the first byte sent to
the close frame and to the end of the TCP connection, and the peak of Python
memory allocated meanwhile (``tracemalloc``; client and server share the process,
so the client's own buffers count too; not for the ``websockets`` rows, where the
client's copies of its 16 MiB would dominate). ``--stock`` runs hypercorn's own
WebSocket stream instead of omnitrio's (``omnitrio/server/_ws_stream.py``), for
comparison. ``--linger-s`` sets ``close_linger_s``; a tiny one (1e-6) hangs up
right after the 1009, as a first prototype did: a client still sending then gets
a reset, which can drop the close frame before it is read (the ``websockets
plain`` rows). Waits are capped at 5 s ("-": nothing came by then).
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import trio  # noqa: E402
import websockets  # noqa: E402
import websockets.sync.client  # noqa: E402

from omnitrio.server import ServerSettings, serve  # noqa: E402
from tests.conftest import chain_config  # noqa: E402
from tests.server.test_frame_limits import (  # noqa: E402
    CLOSE,
    SPEAKING,
    TEXT,
    RawWebSocket,
    _deflate,
)

WAIT_S = 5.0
MIB = 1024 * 1024


@dataclass
class Result:
    scenario: str
    code: int | None
    to_close_s: float | None
    to_end_s: float | None
    peak_bytes: int | None  # None: not measured


def _row(result: Result) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    return (
        f"{result.scenario:<22} {result.code!s:>5} {seconds(result.to_close_s):>9} "
        f"{seconds(result.to_end_s):>9} "
        + ("        -" if result.peak_bytes is None else f"{result.peak_bytes / MIB:>9.2f}")
    )


async def _raw(base_url: str, scenario: str, data: bytes, *, deflate: bool = False) -> Result:
    """Send ``data`` after session.created; read to the close frame, then to EOF."""
    async with await RawWebSocket.connect(base_url, deflate=deflate) as ws:
        await ws.next_event()
        code = to_close_s = to_end_s = None
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        began = trio.current_time()
        try:

            async def send() -> None:
                with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await ws.send(data)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                with trio.move_on_after(WAIT_S):
                    code, _ = await ws.close_code()
                    to_close_s = trio.current_time() - began
                    if await ws.next_frame() is None:
                        to_end_s = trio.current_time() - began
                nursery.cancel_scope.cancel()
            peak = tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
    return Result(scenario, code, to_close_s, to_end_s, peak)


def _standard_client(url: str, compression: str | None) -> Result:
    with websockets.sync.client.connect(
        url, open_timeout=10, close_timeout=WAIT_S, compression=compression
    ) as ws:
        ws.recv(timeout=10)  # session.created
        began = time.monotonic()
        code = to_close_s = None
        with suppress(websockets.ConnectionClosed):
            ws.send(" " * (16 * MIB))
        try:
            ws.recv(timeout=WAIT_S)
        except websockets.ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            to_close_s = time.monotonic() - began
        except TimeoutError:
            pass
    # No memory figure: the client's own copies of the 16 MiB would dominate it.
    name = f"websockets {compression or 'plain'}"
    return Result(name, code, to_close_s, None, None)


def _scenarios(base_url: str, runs: int) -> list[Callable[[], Awaitable[Result]]]:
    frame = RawWebSocket.frame
    reply = frame(CLOSE, struct.pack("!H", 1009))
    url = base_url.replace("http", "ws") + "/v1/realtime"
    scenarios: list[Callable[[], Awaitable[Result]]] = [
        lambda: _raw(base_url, "oversized 32 MiB", frame(TEXT, b" " * (32 * MIB)) + reply),
        lambda: _raw(
            base_url,
            "bomb 128 MiB inflated",
            frame(TEXT, _deflate(b" " * (128 * MIB)), rsv1=True) + reply,
            deflate=True,
        ),
        lambda: _raw(base_url, "declared 2**62", frame(TEXT, b'{"ty', declared_length=2**62)),
        lambda: _raw(base_url, "handshake 256 KiB", frame(TEXT, b" " * (256 * 1024)) + reply),
    ]
    for compression in ("deflate", None) * runs:
        scenarios.append(lambda c=compression: trio.to_thread.run_sync(_standard_client, url, c))
    return scenarios


def _use_stock_hypercorn() -> None:
    import hypercorn.protocol.h2
    import hypercorn.protocol.h11
    from hypercorn.protocol.ws_stream import WSStream

    hypercorn.protocol.h11.WSStream = WSStream  # type: ignore[attr-defined]
    hypercorn.protocol.h2.WSStream = WSStream  # type: ignore[attr-defined]


async def _run(args: argparse.Namespace) -> None:
    config = chain_config(SPEAKING, max_streams=4)
    settings = ServerSettings(
        port=0, max_message_bytes=args.limit_kib * 1024, close_linger_s=args.linger_s
    )
    async with trio.open_nursery() as nursery:
        (base_url, *_) = await nursery.start(serve, config, settings)
        print(f"{'scenario':<22} {'code':>5} {'close s':>9} {'end s':>9} {'peak MiB':>9}")
        for scenario in _scenarios(base_url, args.runs):
            print(_row(await scenario()), flush=True)
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stock", action="store_true", help="hypercorn's own WebSocket stream")
    parser.add_argument("--limit-kib", type=int, default=64, help="max_message_bytes in KiB")
    parser.add_argument("--runs", type=int, default=5, help="runs of each websockets case")
    parser.add_argument("--linger-s", type=float, default=2.0, help="close_linger_s")
    args = parser.parse_args(argv)
    if args.stock:
        _use_stock_hypercorn()
    trio.run(_run, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
