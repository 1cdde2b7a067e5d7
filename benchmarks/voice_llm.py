"""The voice chat's LLM stage on its own: transcript -> first text, and decode speed.

Usage (from the repository root; needs `scripts/setup dev,voice`)::

    python benchmarks/voice_llm.py [--streams 1,4] [--rounds 3] [--repeats 3]
        [--checkout DIR] [--json out.json]

``--checkout DIR`` measures another checkout's LLM stage (e.g. a ``git worktree`` of
an older commit) side by side with this one: each repeat runs this checkout, then
that one, each in a fresh process, so load on the machine falls on both alike.

What runs
---------
The stage of configs/voice-chat.yaml (``stages.voice.llm:SmolLM2Llm`` with that
config's params: bf16, one thread, ``max_new_tokens`` 48), called the way the
runtime's actor calls it: ``open_stream``, then ``step`` with the ASR stage's
``Utterance`` and again with no input until the stream is done. After one warm-up
answer, each round answers ``--streams`` questions at once (greedy, so every round
decodes the same tokens).

Measured per stream: transcript -> first text (from the start of the step that
carries the utterance to the end of the step whose output has the first
``TextDelta``), and per round decode speed (completion tokens of all its streams,
from the ``llm.finish`` event, over the round's wall time after the first step).
Medians over rounds and repeats; with ``--checkout``, this checkout / that one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = (
    "What do cats like to eat?",
    "Why is the sky blue?",
    "What is the capital of France?",
    "How do plants make food?",
    "What is a good name for a dog?",
    "How far away is the moon?",
    "What should I cook for dinner tonight?",
    "Why do we need to sleep?",
)


def _round(stage: Any, num_streams: int, tag: str) -> dict[str, Any]:
    from omnitrio import Event, Request, StreamWork, TextDelta
    from stages.voice.payloads import Utterance

    sids = [f"{tag}-{i}" for i in range(num_streams)]
    for sid in sids:
        stage.open_stream(sid, Request())
    first_ms: dict[str, float] = {}
    tokens = 0
    active, first = set(sids), True
    started = time.perf_counter()
    after_first_step: float | None = None
    while active:
        batch = [
            StreamWork(sid, (Utterance(QUESTIONS[i % len(QUESTIONS)]),) if first else (), True)
            for i, sid in enumerate(sids)
            if sid in active
        ]
        first = False
        outputs = stage.step(batch)
        now = time.perf_counter()
        after_first_step = after_first_step or now
        for sid, output in outputs.items():
            if sid not in first_ms and any(
                isinstance(v, TextDelta) and v.text for v in output.visible
            ):
                first_ms[sid] = 1000 * (now - started)
            for item in output.visible:
                if isinstance(item, Event) and item.name == "llm.finish":
                    tokens += int(item.data["completion_tokens"])  # type: ignore[call-overload]
            if output.done:
                active.discard(sid)
                stage.close_stream(sid)
    decode_s = time.perf_counter() - after_first_step
    return {
        "first_text_ms": [first_ms[sid] for sid in sids if sid in first_ms],
        "tokens": tokens,
        "tokens_per_s": tokens / decode_s if decode_s > 0 else 0.0,
    }


def worker(levels: list[int], rounds: int) -> None:
    """Load the stage of this process's checkout, measure, print one JSON line."""
    config = yaml.safe_load((REPO / "configs" / "voice-chat.yaml").read_text())
    spec = next(s for s in config["stages"] if s["name"] == "llm")
    from stages.voice.llm import SmolLM2Llm

    stage = SmolLM2Llm("llm", spec.get("device", "cpu"), **spec["params"])
    try:
        _round(stage, 1, "warm-up")
        results = {
            str(level): [_round(stage, level, f"l{level}r{r}") for r in range(rounds)]
            for level in levels
        }
    finally:
        stage.close()
    print(json.dumps(results))


def _run(checkout: Path, levels: list[int], rounds: int) -> dict[str, list[dict[str, Any]]]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(REPO / "benchmarks" / "voice_llm.py"), "--worker"]
    command += ["--streams", ",".join(map(str, levels)), "--rounds", str(rounds)]
    done = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the worker for {checkout} failed:\n{done.stderr[-4000:]}")
    parsed: dict[str, list[dict[str, Any]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,4", help="concurrent streams per level")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per level and process")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per checkout")
    parser.add_argument("--checkout", type=Path, help="another checkout to compare with")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    if args.worker:
        worker(levels, args.rounds)
        return
    checkouts = {"this": REPO}
    if args.checkout is not None:
        checkouts["other"] = args.checkout.resolve()
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {k: {} for k in checkouts}
    for _ in range(args.repeats):
        for name, path in checkouts.items():
            for level, rounds in _run(path, levels, args.rounds).items():
                raw[name].setdefault(level, []).extend(rounds)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for name, by_level in raw.items():
        summary[name] = {
            level: {
                "first_text_ms_p50": statistics.median(
                    ms for r in rounds for ms in r["first_text_ms"]
                ),
                "tokens_per_s_p50": statistics.median(r["tokens_per_s"] for r in rounds),
                "num_rounds": len(rounds),
            }
            for level, rounds in by_level.items()
        }
    for level in map(str, levels):
        line = f"streams={level}"
        for name in checkouts:
            s = summary[name][level]
            line += (
                f"  {name}: first text p50 {s['first_text_ms_p50']:.1f} ms,"
                f" {s['tokens_per_s_p50']:.1f} tokens/s"
            )
        if "other" in summary:
            this, other = summary["this"][level], summary["other"][level]
            first = this["first_text_ms_p50"] / other["first_text_ms_p50"]
            speed = this["tokens_per_s_p50"] / other["tokens_per_s_p50"]
            line += f"  this/other: first text {first:.2f}, tokens/s {speed:.2f}"
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "raw": raw}, indent=1))


if __name__ == "__main__":
    main()
