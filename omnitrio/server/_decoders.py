"""Audio decoding in worker processes that can be killed: no decode holds a thread,
a client's request past its time, or the server's shutdown.

``DecoderPool.decode`` sends the upload to an idle worker (``_audio_gate.py`` run as
a script: the whitelist of formats lives there) and waits for its answer on trio, so
it is cancellable like any other wait. A request that runs past ``timeout_s``, or is
cancelled (the client left, the server is stopping), kills its worker; the next
request starts a new one (~0.5 s to import PyAV: measured in docs/reliability.md).
A worker that answered goes back to the idle list, so a steady stream of uploads
pays only the decode. At most ``max_workers`` run at once; more requests wait.

Why processes and not threads: FFmpeg's decode cannot be interrupted from Python,
and trio cannot abandon a thread at shutdown, so a slow or hostile file held a
thread (and with two such, every upload) and kept the server from exiting.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import trio

from . import _audio_gate
from ._audio_gate import ANSWER_HEAD_BYTES, OK, DecodeLimits, UnsupportedAudio

logger = logging.getLogger(__name__)

WORKER_ADDRESS_SPACE_BYTES = 4 << 30
"""A worker's address space (``RLIMIT_AS``): a bomb fails in it, not the server."""


class DecodeTimeout(UnsupportedAudio):
    """The upload took longer to decode than the server gives one request."""


class DecoderPool:
    """Worker processes that decode uploads one request each at a time."""

    def __init__(self, max_workers: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._slots = trio.CapacityLimiter(max_workers)
        self._idle: list[trio.Process] = []
        self.num_started = 0
        self.num_killed = 0

    async def decode(self, data: bytes, demuxer: str, limits: DecodeLimits) -> bytes:
        """Mono PCM16 at 16 kHz (``_audio_gate.decode``); ``UnsupportedAudio`` (or
        ``DecodeTimeout``) naming what is wrong. Blocks until a worker is free and
        has answered; cancelling it kills the worker."""
        frame = _audio_gate.request_frame(data, demuxer, limits)
        async with self._slots:
            worker = self._idle.pop() if self._idle else await self._start()
            answered = False
            try:
                with trio.move_on_after(self.timeout_s) as scope:
                    status, payload = await _exchange(worker, frame)
                    answered = True
            finally:
                if answered:
                    self._idle.append(worker)
                else:
                    with trio.CancelScope(shield=True):
                        await self._kill(worker)
            if scope.cancelled_caught:
                raise DecodeTimeout(
                    f"decoding the file took over {self.timeout_s:g} s; send a shorter file"
                )
        if status != OK:
            raise UnsupportedAudio(payload.decode("utf-8", "replace"))
        return payload

    async def _start(self) -> trio.Process:
        script = Path(_audio_gate.__file__)
        command = [sys.executable, "-I", str(script), str(WORKER_ADDRESS_SPACE_BYTES)]
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self.num_started += 1
        return process

    async def _kill(self, worker: trio.Process) -> None:
        """SIGKILL, then collect its exit (prompt: nothing can hold it)."""
        self.num_killed += 1
        worker.kill()
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                await trio.aclose_forcefully(stream)
        await worker.wait()

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    async def aclose(self) -> None:
        """Stop the idle workers (one mid-request is killed by its cancellation)."""
        idle, self._idle = self._idle, []
        with trio.CancelScope(shield=True):
            for worker in idle:
                await self._kill(worker)


async def _exchange(worker: trio.Process, frame: bytes) -> tuple[int, bytes]:
    """Send one request to ``worker`` and read its answer (status, payload)."""
    assert worker.stdin is not None
    assert worker.stdout is not None
    try:
        await worker.stdin.send_all(frame)
    except trio.BrokenResourceError:
        raise UnsupportedAudio(
            f"{_audio_gate.UNSUPPORTED}: the decoder stopped on the file"
        ) from None
    status, length = _audio_gate.answer_head(
        await _receive_exactly(worker.stdout, ANSWER_HEAD_BYTES)
    )
    return status, await _receive_exactly(worker.stdout, length)


async def _receive_exactly(stream: trio.abc.ReceiveStream, num_bytes: int) -> bytes:
    data = bytearray()
    while len(data) < num_bytes:
        chunk = await stream.receive_some(min(num_bytes - len(data), 1 << 20))
        if not chunk:
            raise UnsupportedAudio(f"{_audio_gate.UNSUPPORTED}: the decoder stopped on the file")
        data += chunk
    return bytes(data)
