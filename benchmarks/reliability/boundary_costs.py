"""What the round-3 trust boundaries cost a request (issue 42), each beside what it
replaced, in one run:

- the phonemizer: a phrase's IPA from its own espeak-ng process (started while the
  previous phrase was sent, ``stages/voice/phonemes.py``) against one process per
  phrase started on demand and one shared process (the old pipe protocol), each
  phrase followed by its Piper synthesis as in the TTS stage (timed apart, for scale);
- the upload decoder: a 1 s and a 56 s upload decoded by a warm worker process
  (``omnitrio/server/_decoders.py``), the first request's worker start, and the same
  decode in-process (the old thread's work).

Run: ``python benchmarks/reliability/boundary_costs.py``; prints one JSON object.
"""

from __future__ import annotations

import io
import json
import os
import select
import statistics
import subprocess
import sys
import time
import wave
from collections.abc import Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from omnitrio.server._audio_gate import DecodeLimits, decode
from omnitrio.server._decoders import DecoderPool
from stages.voice.phonemes import Espeak
from stages.voice.tts import PiperTts

PHRASES = [
    "Cats like to eat fish and meat,",
    "and they sleep for most of the day.",
    "The capital of France is Paris.",
    "Good morning to you, how are you doing today?",
]
ROUNDS = 40


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 2),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e3, 2),
    }


def _timed(call: Callable[[str], object], then: Callable[[str], object]) -> dict[str, float]:
    """``call``'s time per phrase, each followed by ``then`` (untimed), as in the TTS."""
    times = []
    for index in range(ROUNDS):
        phrase = PHRASES[index % len(PHRASES)]
        started = time.perf_counter()
        call(phrase)
        times.append(time.perf_counter() - started)
        then(phrase)
    return _ms(times)


def _on_demand(text: str) -> bytes:
    command = ["espeak-ng", "-q", "--ipa", "-v", "en-us"]
    return subprocess.run(command, input=f"{text}\n".encode(), capture_output=True).stdout


class _SharedPipe:
    """One espeak-ng for all phrases, a paragraph each (the old protocol, less the
    sentinel: the answer's paragraph end is waited for)."""

    def __init__(self) -> None:
        command = ["espeak-ng", "-q", "--ipa", "-v", "en-us"]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __call__(self, text: str) -> bytes:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{text}\n\n".encode())
        self.process.stdin.flush()
        out = b""
        while not out.endswith(b"\n"):
            select.select([self.process.stdout], [], [], 5.0)
            out += os.read(self.process.stdout.fileno(), 65536)
        return out

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def phonemizer() -> dict[str, object]:
    espeak, shared, tts = Espeak("en-us", 5.0), _SharedPipe(), PiperTts("tts")
    try:
        speak = tts.synthesize  # between phrases, as in the stage
        return {
            "own_process_started_ahead": _timed(espeak.ipa, speak),
            "own_process_on_demand": _timed(_on_demand, speak),
            "shared_process_old": _timed(shared, speak),
            "piper_synthesis_of_the_phrase": _timed(speak, len),
        }
    finally:
        espeak.close()
        shared.close()
        tts.close()


def _tone_wav(seconds: float) -> bytes:
    rate_hz, buffer = 24000, io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate_hz)
        wav.writeframes(b"\x00\x10\x00\xf0" * int(rate_hz * seconds / 2))
    return buffer.getvalue()


async def _decoder() -> dict[str, object]:
    limits = DecodeLimits(8000, 96000, 60.0)
    short, long = _tone_wav(1.0), _tone_wav(56.0)
    pool = DecoderPool(1, timeout_s=30.0)
    started = time.perf_counter()
    await pool.decode(short, "wav", limits)
    first_s = time.perf_counter() - started
    figures: dict[str, object] = {"first_request_with_worker_start": _ms([first_s])}
    for name, data in (("1_s_wav", short), ("56_s_wav", long)):
        worker, in_process = [], []
        for _ in range(10):
            started = time.perf_counter()
            await pool.decode(data, "wav", limits)
            worker.append(time.perf_counter() - started)
            started = time.perf_counter()
            decode(data, "wav", limits)
            in_process.append(time.perf_counter() - started)
        figures[name] = {"worker_process": _ms(worker), "in_process_old": _ms(in_process)}
    await pool.aclose()
    return figures


def main() -> None:
    print(json.dumps({"phonemizer": phonemizer(), "decoder": trio.run(_decoder)}, indent=1))


if __name__ == "__main__":
    main()
