"""The voice chat's ASR alone: time per transcript on the latency benchmark's questions.

Usage (from the repository root; needs `scripts/setup dev,voice`)::

    python -m benchmarks.voice_asr [--checkout DIR ...] [--rounds 10] [--config FILE]

Each ``--checkout`` (default: this one) is an omnitrio checkout (e.g. a ``git
archive`` of an older commit): its ASR stage is built from its own
configs/voice-chat.yaml (``impl`` and ``params``) in a process of its own, and
transcribes the questions of benchmarks/voice_latency.py ``--questions latency``
(the Piper voice, a mid-sentence pause of 0.4 s where ``|`` stands), each with the
0.3 s of silence before it (the VAD's prefix padding) and 0.2 s after it (the pause
that starts the answer) that the served ASR gets. With several checkouts the rounds
alternate between them (A B A B ...), so that a change in the machine's load falls
on both. Printed: per question and checkout, the transcript and the p50 / p90 of
the time per transcript (ms, one ``transcribe`` call: encoder and decoder), and the
machine's load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BEFORE_S, AFTER_S = 0.3, 0.2


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def worker(checkout: Path, config: Path, rounds: int, audio: Path, out: Path) -> None:
    """In a process of its own (cwd ``checkout``): that checkout's ASR stage, timed."""
    sys.path.insert(0, str(checkout))
    import importlib

    import yaml

    stage_config = next(
        s for s in yaml.safe_load(config.read_text())["stages"] if s["name"] == "asr"
    )
    module, _, name = stage_config["impl"].partition(":")
    stage_class = getattr(importlib.import_module(module), name)
    stage = stage_class("asr", stage_config.get("device", "cpu"), **stage_config["params"])
    questions = json.loads(audio.with_suffix(".json").read_text())
    samples = np.load(audio)
    clips = [samples[str(n)] for n in range(len(questions))]
    for clip in clips:  # warm: the first call of a session allocates
        stage.transcribe(clip)
    times: dict[str, list[float]] = {q: [] for q in questions}
    texts: dict[str, str] = {}
    for _ in range(rounds):
        for question, clip in zip(questions, clips, strict=True):
            started = time.perf_counter()
            texts[question] = stage.transcribe(clip)
            times[question].append((time.perf_counter() - started) * 1000)
    out.write_text(json.dumps({"times": times, "texts": texts}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", type=Path, action="append", help="default: this one")
    parser.add_argument("--rounds", type=int, default=10, help="transcripts per question")
    parser.add_argument("--config", type=Path, help="default: each checkout's voice-chat.yaml")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--audio", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    if args.worker:
        config = args.config or checkouts[0] / "configs" / "voice-chat.yaml"
        worker(checkouts[0], config, args.rounds, args.audio, args.out)
        return

    sys.path.insert(0, str(REPO))
    from benchmarks.voice_latency import QUESTION_SETS, speech
    from omnitrio import resample_float
    from stages.voice.pcm import pcm16_to_float
    from tests.voice_support import INPUT_RATE_HZ

    print(f"load at start: {load()}")
    questions = list(QUESTION_SETS["latency"])
    with tempfile.TemporaryDirectory() as scratch:
        clips = {}
        for n, question in enumerate(questions):
            folder = Path(scratch) / str(n)
            folder.mkdir()
            pcm16, _ = speech(question, folder, "piper", 0.4)
            spoken = resample_float(pcm16_to_float(pcm16), INPUT_RATE_HZ, 16000)
            clips[str(n)] = np.concatenate(
                [np.zeros(int(BEFORE_S * 16000)), spoken, np.zeros(int(AFTER_S * 16000))]
            ).astype(np.float32)
        audio = Path(scratch) / "audio.npz"
        np.savez(audio, **clips)
        audio.with_suffix(".json").write_text(json.dumps(questions))
        results: dict[Path, dict[str, dict[str, object]]] = {c: {} for c in checkouts}
        halves = [args.rounds - args.rounds // 2, args.rounds // 2]
        for half in halves:
            for checkout in checkouts:
                if half == 0:
                    continue
                out = Path(scratch) / "out.json"
                command = [sys.executable, str(Path(__file__).resolve()), "--worker"]
                command += ["--checkout", str(checkout), "--rounds", str(half)]
                command += ["--audio", str(audio), "--out", str(out)]
                if args.config:
                    command += ["--config", str(args.config.resolve())]
                env = {**os.environ, "PYTHONPATH": str(checkout)}
                subprocess.run(command, cwd=checkout, check=True, env=env)
                got = json.loads(out.read_text())
                for question in questions:
                    entry = results[checkout].setdefault(question, {"times": []})
                    entry["text"] = got["texts"][question]
                    entry["times"] += got["times"][question]  # type: ignore[operator]
    print(f"load at end: {load()}")
    print(f"\n{args.rounds} transcripts per question and checkout; ms per transcript\n")
    print("| question | audio s | checkout | p50 | p90 | transcript |")
    print("|---|---|---|---|---|---|")
    for n, question in enumerate(questions):
        for checkout in checkouts:
            entry = results[checkout][question]
            times = np.array(entry["times"])
            said = question.replace(" |", "")
            print(
                f"| {said} | {clips[str(n)].size / 16000:.2f} | {checkout.name} "
                f"| {np.percentile(times, 50):.1f} | {np.percentile(times, 90):.1f} "
                f"| {entry['text']} |"
            )
    for checkout in checkouts:
        every = np.concatenate([results[checkout][q]["times"] for q in questions])
        print(
            f"\nall questions, {checkout.name}: p50 {np.percentile(every, 50):.1f} ms, "
            f"mean {every.mean():.1f} ms"
        )


if __name__ == "__main__":
    main()
