"""Where the peer's time goes: CPU seconds of each of its processes over one closed-loop run.

    .peers/sglang-omni/bin/python -m sglang_omni_synthetic.profile SPEC_JSON STREAMS TOKENS

(with ``PYTHONPATH=benchmarks/peers/sglang_omni/standin:benchmarks/peers/sglang_omni``).
Starts the package's runner as the driver does, sends ``STREAMS`` requests of ``TOKENS``
tokens at once through ``Client.generate(stream=True)``, and prints, per process, the CPU
seconds it used (user + system, from ``/proc``) against the run's wall time, with the
median first text and first audio. A process near 1.0 CPU-second per second is saturated.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from .driver import _tree

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> tuple[str, float]:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return name, (int(fields[11]) + int(fields[12])) / TICKS


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmd:
        return cmd.read().replace(b"\0", b" ").decode(errors="replace")[-60:]


async def _one(client: Any, tokens: int) -> tuple[float, float]:
    from sglang_omni.client.types import GenerateRequest

    start = time.perf_counter()
    first: dict[str, float] = {}
    request = GenerateRequest(prompt="w1 w2 w3 w4 w5 w6 w7 w8", max_tokens=tokens, stream=True)
    async for chunk in client.generate(request):
        kind = "audio" if chunk.audio_data is not None else "text" if chunk.text else None
        if kind is not None:
            first.setdefault(kind, time.perf_counter() - start)
    return first["text"], first["audio"]


async def _main(spec: dict[str, Any], streams: int, tokens: int) -> None:
    from sglang_omni.client import Client
    from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

    from .pipeline import build_config

    runner = MultiProcessPipelineRunner(build_config(spec))
    await runner.start(timeout=240)
    try:
        client = Client(runner.coordinator)
        await _one(client, 4)  # warm-up
        pids = _tree(os.getpid())
        names = {os.getpid(): "coordinator + client (driver)"}
        for group in runner.groups:
            for process in group.processes:
                names[process.pid] = f"stage process {group.group_name}"
        before = {pid: _cpu_s(pid)[1] for pid in pids}
        start = time.perf_counter()
        firsts = await asyncio.gather(*(_one(client, tokens) for _ in range(streams)))
        wall_s = time.perf_counter() - start
        print(f"{streams} streams x {tokens} tokens: {wall_s:.2f} s wall")
        print(
            f"first text p50 {statistics.median(f[0] for f in firsts) * 1000:.0f} ms, "
            f"first audio p50 {statistics.median(f[1] for f in firsts) * 1000:.0f} ms"
        )
        for pid in pids:
            name, cpu_s = _cpu_s(pid)
            used = cpu_s - before.get(pid, 0.0)
            label = names.get(pid, f"{name} {_cmdline(pid)}")
            print(f"  pid {pid:>7} {used / wall_s:5.2f} CPU-s/s  {label}")
    finally:
        await runner.stop()
    _summarize_traces(start)


def _summarize_traces(start: float) -> None:
    """Per stage: steps of each kind, their mean rows and the share of the run busy."""
    folder = os.environ.get("SGLANG_OMNI_SYNTHETIC_TRACE")
    if folder is None:
        return
    for name in ("thinker", "talker_ar", "code2wav"):
        path = os.path.join(folder, f"{name}.json")
        if not os.path.exists(path):
            continue
        with open(path) as trace:
            steps = [s for s in json.load(trace) if s[2] >= start]
        if not steps:
            continue
        span = steps[-1][3] - start
        busy = sum(s[3] - s[2] for s in steps)
        kinds: dict[str, list[int]] = {}
        for kind, rows, _, _ in steps:
            kinds.setdefault(kind, []).append(rows)
        described = ", ".join(
            f"{kind} {len(rows)} (mean rows {statistics.mean(rows):.1f})"
            for kind, rows in kinds.items()
        )
        first_s = steps[0][2] - start
        print(
            f"  {name}: busy {busy / span:.0%} of {span:.2f} s, first step at "
            f"{first_s * 1000:.0f} ms; {described}"
        )


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
