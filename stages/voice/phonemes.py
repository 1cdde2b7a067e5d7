"""Text to Piper phoneme ids, with espeak-ng run as a separate program.

espeak-ng is GPL-3.0, so it never runs inside the omnitrio process: the TTS stage
keeps ONE long-lived ``espeak-ng -q --ipa`` process (``Espeak``) and writes each
phrase to its standard input as a paragraph, followed by a sentinel paragraph
whose IPA is known; the phrase's IPA is what comes back before the sentinel's.
A process that fails or takes longer than the timeout is killed and reaped, and
the next phrase starts a new one; ``close`` ends it. The IPA is mapped to the
voice's symbol ids the way Piper does: NFD-normalised code points, each followed
by the pad symbol, between the begin and end symbols.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ESPEAK = "espeak-ng"
INSTALL_ESPEAK = "install espeak-ng (Debian/Ubuntu: apt-get install espeak-ng)"
_CLAUSE_END = re.compile(r"[.!?;:,]\s*$")


class PhonemizerError(RuntimeError):
    """espeak-ng could not be run or failed on a phrase."""


@dataclass(frozen=True)
class VoiceSymbols:
    """A Piper voice's phoneme -> id table and its special symbols."""

    ids: dict[str, int]
    pad: int
    begin: int
    end: int
    espeak_voice: str
    sample_rate_hz: int
    noise_scale: float
    length_scale: float
    noise_w: float

    @classmethod
    def from_json(cls, path: Path) -> VoiceSymbols:
        config = json.loads(path.read_text(encoding="utf-8"))
        table = {symbol: ids[0] for symbol, ids in config["phoneme_id_map"].items()}
        inference = config["inference"]
        return cls(
            ids=table,
            pad=table["_"],
            begin=table["^"],
            end=table["$"],
            espeak_voice=config["espeak"]["voice"],
            sample_rate_hz=int(config["audio"]["sample_rate"]),
            noise_scale=float(inference["noise_scale"]),
            length_scale=float(inference["length_scale"]),
            noise_w=float(inference["noise_w"]),
        )


def find_espeak() -> str:
    path = shutil.which(ESPEAK)
    if path is None:
        raise PhonemizerError(f"{ESPEAK} is not on PATH; {INSTALL_ESPEAK}")
    return path


SENTINEL = "xylophone"
"""Spoken after every phrase: the end of its IPA marks the end of the phrase's."""


class Espeak:
    """One ``espeak-ng`` process for one voice, reused phrase after phrase."""

    def __init__(self, voice: str, timeout_s: float) -> None:
        self.program = find_espeak()  # fail at load, not at the first answer
        self.voice = voice
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._sentinel_ipa: bytes | None = None
        self.num_started = 0

    def ipa(self, text: str) -> str:
        """IPA for ``text``; clauses joined by the text's punctuation."""
        clauses = [line.strip() for line in self._ask(text).splitlines() if line.strip()]
        ending = _CLAUSE_END.search(text.strip())
        return ", ".join(clauses) + (ending.group(0).strip() if ending else "")

    def _ask(self, text: str) -> str:
        if self._sentinel_ipa is None:
            self._sentinel_ipa = b"\n" + self._exchange(SENTINEL, b"").strip() + b"\n\n"
        raw = self._exchange(text, self._sentinel_ipa)
        return raw[: -len(self._sentinel_ipa)].decode("utf-8", "replace")

    def _exchange(self, text: str, sentinel_ipa: bytes) -> bytes:
        """Write ``text`` and the sentinel; read until the sentinel's IPA (or, while it
        is still unknown, until the blank line that ends a paragraph)."""
        process = self._running()
        one_line = " ".join(text.split())
        request = f"{one_line}\n\n{SENTINEL}\n\n" if sentinel_ipa else f"{one_line}\n\n"
        assert process.stdin is not None
        assert process.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        out = b""
        try:
            process.stdin.write(request.encode("utf-8"))
            process.stdin.flush()
            end = sentinel_ipa or b"\n\n"
            while not out.endswith(end):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
                    raise PhonemizerError(f"{ESPEAK} took over {self.timeout_s} s on {text[:40]!r}")
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    raise PhonemizerError(f"{ESPEAK} exited ({process.poll()}) on {text[:40]!r}")
                out += chunk
        except (OSError, PhonemizerError) as exc:
            self.close()
            if isinstance(exc, PhonemizerError):
                raise
            raise PhonemizerError(f"{ESPEAK} failed on {text[:40]!r}: {exc}") from exc
        return out

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [self.program, "-q", "--ipa", "-v", self.voice],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            self.num_started += 1
        return self._process

    def close(self) -> None:
        """End the process (idempotent); the next phrase would start a new one."""
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        try:
            process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def phoneme_ids(ipa: str, symbols: VoiceSymbols) -> list[int]:
    """Piper's input ids: ^ _ (phoneme _)* $ ; symbols the voice lacks are skipped."""
    ids = [symbols.begin, symbols.pad]
    for char in unicodedata.normalize("NFD", ipa):
        symbol = symbols.ids.get(char)
        if symbol is not None:
            ids += [symbol, symbols.pad]
    ids.append(symbols.end)
    return ids
