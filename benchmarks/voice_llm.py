"""The voice chat's LLM stage on its own: transcript -> first text, decode speed, CPU
per answer, and memory over a long run.

Usage (from the repository root; needs `scripts/setup dev,voice`)::

    python benchmarks/voice_llm.py [--streams 1,4] [--rounds 3] [--repeats 3]
        [--checkout DIR] [--param key=value ...] [--json out.json]
    python benchmarks/voice_llm.py --memory 320 [--chats 16] [--checkout DIR]

``--checkout DIR`` measures another checkout's LLM stage (e.g. a ``git worktree`` of
an older commit) side by side with this one: each repeat runs this checkout, then
that one, each in a fresh process (with its own configs/voice-chat.yaml), so load on
the machine falls on both alike. ``--param key=value`` sets a stage param over the
config's (both checkouts).

What runs
---------
The stage of configs/voice-chat.yaml (``stages.voice.llm:SmolLM2Llm`` with that
config's params), called the way the runtime's actor calls it: ``open_stream`` with
the conversation so far as the request's text (``user: ...`` / ``assistant: ...``
lines, as the Realtime session sends it), then ``step`` with the ASR stage's
``Utterance`` and again with no input until the stream is done. After one warm-up
answer, each level holds ``--streams`` conversations; each round is one turn of each,
all at once (greedy), so from the second round on every prompt has a history.
Between rounds the stage finishes its background work (a stage that prefills the
next turn's history does it then, as it would while the user speaks).

Measured per stream: transcript -> first text (from the start of the step that
carries the utterance to the end of the step whose output has the first
``TextDelta``), alone for the turns with a history too; per round decode speed
(completion tokens of all its streams, from the ``llm.finish`` event, over the round's
wall time after the first step) and the process's CPU time per answer (background
work between rounds included). Medians over rounds and repeats; with ``--checkout``,
this checkout / that one.

``--memory TURNS``: TURNS short answers (8 tokens) over ``--chats`` conversations,
four at a time, each turn with its conversation so far (each question numbered, so no
two conversations share a history); prints the process's RSS
after every ``--chats`` answers and the CTranslate2 static-prompt ledger
(llm_ct2_states.py) at the end.
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


def _rss_mb() -> float:
    """The process's resident memory, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _history(turns: list[tuple[str, str]]) -> str:
    """A conversation's earlier turns as the Realtime session sends them (``role: text``)."""
    return "\n".join(f"user: {q}\nassistant: {a}" for q, a in turns)


def _settle(stage: Any) -> None:
    """Let the stage finish what it does between turns (a checkout that warms the next
    turn's state does it here, as it would while the user speaks)."""
    flush = getattr(getattr(stage, "fast", None), "flush", None)
    if flush is not None:
        flush(60.0)


def _round(
    stage: Any,
    chats: list[list[tuple[str, str]]],
    tag: str,
    round_: int,
    max_tokens: int | None = None,
    numbered: int | None = None,
) -> dict[str, Any]:
    """One turn of each conversation in ``chats``, all at once; appends the turns."""
    from omnitrio import Event, Request, StreamWork, TextDelta
    from stages.voice.payloads import Utterance

    sids = [f"{tag}-{i}" for i in range(len(chats))]
    questions = [QUESTIONS[(i + round_) % len(QUESTIONS)] for i in range(len(chats))]
    if numbered is not None:  # each conversation its own history (--memory)
        questions = [f"Question {numbered + i}: {q}" for i, q in enumerate(questions)]
    options = {} if max_tokens is None else {"max_tokens": max_tokens}
    for sid, chat in zip(sids, chats, strict=True):
        stage.open_stream(sid, Request(text=_history(chat), options=options))
    first_ms: dict[str, float] = {}
    texts = dict.fromkeys(sids, "")
    tokens = 0
    active, first = set(sids), True
    cpu_started = time.process_time()
    started = time.perf_counter()
    after_first_step: float | None = None
    while active:
        batch = [
            StreamWork(sid, (Utterance(questions[i]),) if first else (), True)
            for i, sid in enumerate(sids)
            if sid in active
        ]
        first = False
        outputs = stage.step(batch)
        now = time.perf_counter()
        after_first_step = after_first_step or now
        for sid, output in outputs.items():
            text = "".join(v.text for v in output.visible if isinstance(v, TextDelta))
            if sid not in first_ms and text:
                first_ms[sid] = 1000 * (now - started)
            texts[sid] += text
            for item in output.visible:
                if isinstance(item, Event) and item.name == "llm.finish":
                    tokens += int(item.data["completion_tokens"])  # type: ignore[call-overload]
            if output.done:
                active.discard(sid)
                stage.close_stream(sid)
    decode_s = time.perf_counter() - after_first_step
    _settle(stage)
    for sid, question, chat in zip(sids, questions, chats, strict=True):
        chat.append((question, texts[sid]))
    return {
        "first_text_ms": [first_ms[sid] for sid in sids if sid in first_ms],
        "history": round_ > 0,
        "tokens": tokens,
        "tokens_per_s": tokens / decode_s if decode_s > 0 else 0.0,
        "cpu_ms_per_answer": 1000 * (time.process_time() - cpu_started) / len(sids),
    }


def _stage(params: dict[str, Any]) -> Any:
    # The checkout measured is the working directory (its own config and params).
    config = yaml.safe_load((Path.cwd() / "configs" / "voice-chat.yaml").read_text())
    spec = next(s for s in config["stages"] if s["name"] == "llm")
    from stages.voice.llm import SmolLM2Llm

    return SmolLM2Llm("llm", spec.get("device", "cpu"), **{**spec["params"], **params})


def worker(levels: list[int], rounds: int, params: dict[str, Any]) -> None:
    """Load the stage of this process's checkout, measure, print one JSON line."""
    stage = _stage(params)
    try:
        _round(stage, [[]], "warm-up", 0)
        results = {}
        for level in levels:
            chats: list[list[tuple[str, str]]] = [[] for _ in range(level)]
            results[str(level)] = [_round(stage, chats, f"l{level}r{r}", r) for r in range(rounds)]
    finally:
        stage.close()
    print(json.dumps(results))


def memory_worker(num_turns: int, num_chats: int, params: dict[str, Any]) -> None:
    """``num_turns`` short answers (8 tokens) over ``num_chats`` conversations, 4 at a
    time; the process's RSS after every ``num_chats`` answers (one JSON line)."""
    stage = _stage(params)
    chats: list[list[tuple[str, str]]] = [[] for _ in range(num_chats)]
    rss: list[float] = [_rss_mb()]
    try:
        for turn in range(0, num_turns, 4):
            group = [(turn + i) % num_chats for i in range(4)]
            picked = [chats[i] for i in group]
            _round(stage, picked, f"m{turn}", turn // num_chats, max_tokens=8, numbered=turn)
            if (turn + 4) % num_chats == 0:
                rss.append(_rss_mb())
        fast = getattr(stage, "fast", None)
        states = getattr(fast, "states", None)
        ledger = {
            k: getattr(states, k)
            for k in ("num_tokens", "num_warmed", "num_hits", "num_recycled", "budget_tokens")
            if states is not None
        }
        if states is not None:
            ledger["num_generators"] = fast.num_generators  # type: ignore[union-attr]
    finally:
        stage.close()
    print(json.dumps({"rss_mb": rss, "states": ledger}))


def _run(checkout: Path, levels: list[int], rounds: int, extra: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(REPO / "benchmarks" / "voice_llm.py"), "--worker"]
    command += ["--streams", ",".join(map(str, levels)), "--rounds", str(rounds), *extra]
    done = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the worker for {checkout} failed:\n{done.stderr[-4000:]}")
    parsed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def _params(pairs: list[str]) -> dict[str, Any]:
    """``--param key=value`` (the value read as YAML) over the config's params."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--param wants key=value, not {pair!r}")
        params[key] = yaml.safe_load(value)
    return params


def _summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    later = [ms for r in rounds if r["history"] for ms in r["first_text_ms"]]
    return {
        "first_text_ms_p50": statistics.median(ms for r in rounds for ms in r["first_text_ms"]),
        "first_text_with_history_ms_p50": statistics.median(later) if later else 0.0,
        "tokens_per_s_p50": statistics.median(r["tokens_per_s"] for r in rounds),
        "cpu_ms_per_answer_p50": statistics.median(r["cpu_ms_per_answer"] for r in rounds),
        "num_rounds": len(rounds),
    }


def _print_levels(levels: list[int], summary: dict[str, dict[str, dict[str, float]]]) -> None:
    for level in map(str, levels):
        line = f"streams={level}"
        for name, by_level in summary.items():
            s = by_level[level]
            line += (
                f"\n  {name}: first text p50 {s['first_text_ms_p50']:.1f} ms"
                f" (turns with history {s['first_text_with_history_ms_p50']:.1f}),"
                f" {s['tokens_per_s_p50']:.1f} tokens/s,"
                f" CPU {s['cpu_ms_per_answer_p50']:.0f} ms per answer"
            )
        if "other" in summary:
            this, other = summary["this"][level], summary["other"][level]
            ratios = {
                k: this[k] / other[k] if other[k] else 0.0
                for k in (
                    "first_text_ms_p50",
                    "first_text_with_history_ms_p50",
                    "tokens_per_s_p50",
                    "cpu_ms_per_answer_p50",
                )
            }
            line += (
                f"\n  this/other: first text {ratios['first_text_ms_p50']:.2f}"
                f" (with history {ratios['first_text_with_history_ms_p50']:.2f}),"
                f" tokens/s {ratios['tokens_per_s_p50']:.2f},"
                f" CPU per answer {ratios['cpu_ms_per_answer_p50']:.2f}"
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,4", help="concurrent streams per level")
    parser.add_argument("--rounds", type=int, default=3, help="turns per conversation")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per checkout")
    parser.add_argument("--checkout", type=Path, help="another checkout to compare with")
    parser.add_argument("--param", action="append", default=[], help="key=value for the stage")
    parser.add_argument("--memory", type=int, metavar="TURNS", help="RSS over TURNS turns")
    parser.add_argument("--chats", type=int, default=16, help="conversations (--memory)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    params = _params(args.param)
    if args.worker:
        if args.memory:
            memory_worker(args.memory, args.chats, params)
        else:
            worker(levels, args.rounds, params)
        return
    checkouts = {"this": REPO}
    if args.checkout is not None:
        checkouts["other"] = args.checkout.resolve()
    extra = [f"--param={p}" for p in args.param]
    if args.memory:
        extra += ["--memory", str(args.memory), "--chats", str(args.chats)]
        memory = {name: _run(path, levels, 0, extra) for name, path in checkouts.items()}
        for name, result in memory.items():
            rss = " ".join(f"{mb:.0f}" for mb in result["rss_mb"])
            print(f"{name}: RSS MiB every {args.chats} answers: {rss}; states {result['states']}")
        if args.json is not None:
            args.json.write_text(json.dumps(memory, indent=1))
        return
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {k: {} for k in checkouts}
    for _ in range(args.repeats):
        for name, path in checkouts.items():
            for level, rounds in _run(path, levels, args.rounds, extra).items():
                raw[name].setdefault(level, []).extend(rounds)
    summary = {
        name: {level: _summary(rounds) for level, rounds in by_level.items()}
        for name, by_level in raw.items()
    }
    _print_levels(levels, summary)
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "raw": raw}, indent=1))


if __name__ == "__main__":
    main()
