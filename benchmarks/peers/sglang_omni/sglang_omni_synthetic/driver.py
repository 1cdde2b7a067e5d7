"""The peer's driver: sglang-omni's runtime behind a small line protocol on stdin/stdout.

Run by omnitrio's benchmark (``benchmarks/baselines/_sglang_omni.py``) with the peer
venv's Python: ``python -m sglang_omni_synthetic.driver SPEC_JSON``. It starts the
package's ``MultiProcessPipelineRunner`` (one spawned process per stage), then serves
requests through the package's ``Client.generate(stream=True)``.

Protocol, one JSON object a line, each at most ``MAX_LINE_BYTES``:

- in:  ``{"op": "open", "id": N, "text": S, "steps": K}``, ``{"op": "abort", "id": N}``,
  ``{"op": "sample"}``, ``{"op": "close"}``;
- out: ``{"ev": "ready", "version": V, "standin": [...], "pids": [...]}`` once started,
  then per request ``{"ev": "text"|"audio", "id": N, "t": T, "s": SECONDS}``,
  ``{"ev": "done", "id": N}``, ``{"ev": "refused"|"error", "id": N, "msg": M}``, and
  ``{"ev": "sample", "rss": BYTES, "open": N}``.

``t`` is ``time.perf_counter()`` when the client API yielded the chunk (CLOCK_MONOTONIC,
the same clock in every process of the machine), so the harness measures the peer at
its own client, not after this pipe.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from importlib.metadata import version
from typing import Any

MAX_LINE_BYTES = 1 << 16
MAX_OPEN = 4096  # requests in flight through this driver at once


def _protocol_out() -> Any:
    """This process's stdout for the protocol alone: fd 1 becomes stderr, so nothing the
    package or its stage processes print can reach the harness as a message."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


_OUT = _protocol_out() if __name__ == "__main__" else sys.stdout


def _emit(event: dict[str, Any]) -> None:
    line = json.dumps(event, separators=(",", ":"))
    _OUT.write(line[: MAX_LINE_BYTES - 1] + "\n")
    _OUT.flush()


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (the stage processes the runner spawned)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


async def _serve(client: Any, request: dict[str, Any], tasks: dict[int, asyncio.Task]) -> None:
    from sglang_omni.client.types import GenerateRequest

    ident = int(request["id"])
    try:
        generate = GenerateRequest(
            prompt=str(request["text"]), max_tokens=int(request["steps"]), stream=True
        )
        async for chunk in client.generate(generate, request_id=f"bench-{ident}"):
            now = time.perf_counter()
            if chunk.audio_data is not None:
                rate = chunk.sample_rate or 24000
                _emit({"ev": "audio", "id": ident, "t": now, "s": len(chunk.audio_data) / rate})
            elif chunk.text:
                _emit({"ev": "text", "id": ident, "t": now})
        _emit({"ev": "done", "id": ident})
    except asyncio.CancelledError:
        await client.abort(f"bench-{ident}")
        raise
    except Exception as exc:  # the request's failure, told to the harness
        kind = "refused" if type(exc).__name__ == "QueueFullError" else "error"
        _emit({"ev": kind, "id": ident, "msg": f"{type(exc).__name__}: {exc}"[:1000]})
    finally:
        tasks.pop(ident, None)


async def _main(spec: dict[str, Any]) -> None:
    from sglang_omni.client import Client
    from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

    from .pipeline import build_config

    runner = MultiProcessPipelineRunner(build_config(spec))
    await runner.start(timeout=float(spec.get("start_timeout_s", 180.0)))
    client = Client(runner.coordinator)
    tasks: dict[int, asyncio.Task] = {}
    pids = _tree(os.getpid())
    import sglang

    _emit(
        {
            "ev": "ready",
            "version": version("sglang-omni"),
            "standin": sorted(m for m in sys.modules if m.split(".")[0] == "sglang"),
            "standin_version": sglang.__version__,
            "pids": pids,
        }
    )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            command = json.loads(line)
            op = command.get("op")
            if op == "open" and len(tasks) < MAX_OPEN:
                ident = int(command["id"])
                tasks[ident] = asyncio.create_task(_serve(client, command, tasks))
            elif op == "open":
                _emit({"ev": "refused", "id": command["id"], "msg": "driver: too many open"})
            elif op == "abort" and int(command["id"]) in tasks:
                tasks[int(command["id"])].cancel()
            elif op == "sample":
                _emit({"ev": "sample", "rss": _rss_bytes(_tree(os.getpid())), "open": len(tasks)})
            elif op == "close":
                break
    finally:
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await runner.stop()


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1])))
