"""sglang-omni's own runtime as a baseline: the real peer, on omnitrio's synthetic stages.

Not a model of it: the package's ``MultiProcessPipelineRunner`` spawns one process per
stage as it lays out Qwen3-Omni, its coordinator admits and merges, its zmq control
plane and relay carry the chunks, and its ``Client.generate(stream=True)`` yields them.
Only the stages' work is ours: the same step-time model as omnitrio's synthetic stages,
written on the package's scheduler hooks (``benchmarks/peers/sglang_omni/``, which says
what stands in for SGLang's AR scheduler and why it is faithful).

The peer runs in its own virtual environment (``benchmarks/peers/sglang_omni/setup``
makes ``.peers/sglang-omni``) with a stand-in for the nine ``sglang`` platform and
helper modules its runtime imports; neither is ever on omnitrio's import path. This
module starts the peer's driver there and speaks its line protocol (one JSON object a
line, bounded) over the driver's stdin and stdout.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from omnitrio import PipelineConfig

from ..harness._args import REPO
from ..harness._record import AudioArrival
from ..harness._target import Prompt, Refused, Sample, TargetError, Timeline
from ._sglang_omni_spec import peer_spec

logger = logging.getLogger(__name__)

PEER_DIR = REPO / "benchmarks" / "peers" / "sglang_omni"
PEER_VENV = REPO / ".peers" / "sglang-omni"
SETUP_COMMAND = "benchmarks/peers/sglang_omni/setup"
MAX_LINE_BYTES = 1 << 16  # the driver's bound on one message
START_TIMEOUT_S = 240.0  # five stage processes on a small, busy machine
STOP_TIMEOUT_S = 30.0


class PeerUnavailable(ValueError):
    """The peer's virtual environment is missing; the message says how to make it."""


def peer_python() -> Path:
    """The peer venv's Python, or ``PeerUnavailable`` naming the setup command."""
    python = PEER_VENV / "bin" / "python"
    if not python.is_file():
        raise PeerUnavailable(
            f"--baseline sglang-omni needs the peer's own environment ({PEER_VENV} is "
            f"missing): run {SETUP_COMMAND}"
        )
    return python


class SglangOmniPeer:
    """One request per ``open`` message; arrivals are stamped by the peer's client."""

    def __init__(self, process: trio.Process, ready: dict[str, Any], name: str) -> None:
        self.name = name
        self.process = process
        self.version = str(ready.get("version"))
        self.standin = tuple(str(m) for m in ready.get("standin", ()))
        self._next_id = 0
        self._requests: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._samples: trio.MemorySendChannel[dict[str, Any]] | None = None
        self._send_lock = trio.Lock()
        self._sample_lock = trio.Lock()

    def peer_report(self) -> dict[str, str]:
        """What the report says of the peer: the package's version and the stand-in."""
        return {
            "package": f"sglang-omni {self.version} (its own runtime, {PEER_VENV.name} venv)",
            "stand-in sglang modules": ", ".join(self.standin),
        }

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        async with self._send_lock:
            await self.process.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def read_forever(self) -> None:
        """Route each message of the driver to the request (or sample) it answers."""
        assert self.process.stdout is not None
        buffer = b""
        async for data in self.process.stdout:
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self._dispatch(json.loads(line))
            if len(buffer) > MAX_LINE_BYTES:
                raise TargetError(f"sglang-omni peer sent a line over {MAX_LINE_BYTES} bytes")
        for send in list(self._requests.values()):  # the driver ended: fail what is open
            send.send_nowait({"ev": "error", "msg": "the sglang-omni peer exited"})

    def _dispatch(self, message: dict[str, Any]) -> None:
        if message.get("ev") == "sample":
            if self._samples is not None:
                self._samples.send_nowait(message)
            return
        send = self._requests.get(int(message.get("id", -1)))
        if send is not None:
            send.send_nowait(message)

    async def request(self, prompt: Prompt, timeline: Timeline) -> None:
        ident = self._next_id
        self._next_id += 1
        send, receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._requests[ident] = send
        finished = False
        try:
            await self._send(
                {"op": "open", "id": ident, "text": prompt.text, "steps": prompt.output_len}
            )
            async for message in receive:
                event = message["ev"]
                if event == "text":
                    timeline.text_at_s.append(message["t"] - timeline.sent_s)
                elif event == "audio":
                    duration_s = float(message["s"])
                    timeline.audio.append(AudioArrival(message["t"] - timeline.sent_s, duration_s))
                    await timeline.consume(duration_s)
                elif event == "done":
                    finished = True
                    return
                elif event == "refused":
                    finished = True
                    raise Refused(message.get("msg", "refused"))
                else:
                    finished = True
                    raise TargetError(message.get("msg", "failed"))
        finally:
            del self._requests[ident]
            if not finished:  # abandoned: the peer's client aborts it
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await self._send({"op": "abort", "id": ident})

    async def sample(self) -> Sample | None:
        async with self._sample_lock:
            send, receive = trio.open_memory_channel[dict[str, Any]](1)
            self._samples = send
            try:
                await self._send({"op": "sample"})
                with trio.move_on_after(2):
                    reply = await receive.receive()
                    return Sample(
                        at_s=0.0,
                        open_streams=int(reply["open"]),
                        queue_depth={},
                        batch_size={},
                        rss_bytes=int(reply["rss"]),
                    )
            finally:
                self._samples = None
        return None


async def _read_ready(process: trio.Process, log: Path) -> tuple[dict[str, Any], bytes]:
    assert process.stdout is not None
    buffer = b""
    with trio.move_on_after(START_TIMEOUT_S):
        async for data in process.stdout:
            buffer += data
            if b"\n" in buffer:
                line, rest = buffer.split(b"\n", 1)
                return json.loads(line), rest
    tail = (await trio.Path(log).read_text(errors="replace"))[-3000:]
    raise TargetError(f"the sglang-omni peer did not start; its log ends:\n{tail}")


@asynccontextmanager
async def open_sglang_omni(
    config: PipelineConfig, name: str = "sglang-omni"
) -> AsyncIterator[SglangOmniPeer]:
    """Start the peer's driver (and through it the package's stage processes)."""
    python = peer_python()
    spec = json.dumps(peer_spec(config))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PEER_DIR / "standin"), str(PEER_DIR)]),
    }
    with tempfile.NamedTemporaryFile(prefix="sglang-omni-peer-", suffix=".log") as log:
        process = await trio.lowlevel.open_process(
            [str(python), "-m", "sglang_omni_synthetic.driver", spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=str(PEER_DIR),
        )
        try:
            ready, rest = await _read_ready(process, Path(log.name))
            if rest:
                raise TargetError(f"the sglang-omni peer said more than ready: {rest[:200]!r}")
            peer = SglangOmniPeer(process, ready, name)
            logger.info("sglang-omni %s, stand-in modules %s", peer.version, peer.standin)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(peer.read_forever)
                try:
                    yield peer
                finally:
                    with trio.CancelScope(shield=True):
                        with trio.move_on_after(5):
                            await peer._send({"op": "close"})
                        with trio.move_on_after(STOP_TIMEOUT_S):
                            await process.wait()
                    nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
