"""Text to Piper phoneme ids, with espeak-ng run as a separate program.

espeak-ng is GPL-3.0, so it never runs inside the omnitrio process: each
phrase is piped to a short-lived ``espeak-ng -q --ipa`` process (about 10 ms)
and its IPA output read back. The process is always waited for (or killed on
timeout), so none outlives the call. The IPA is mapped to the voice's symbol
ids the way Piper does: NFD-normalised code points, each followed by the pad
symbol, between the begin and end symbols.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
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


def phonemize(text: str, voice: str, timeout_s: float, program: str | None = None) -> str:
    """IPA for ``text`` from an espeak-ng process; clauses joined by the text's punctuation."""
    try:
        done = subprocess.run(
            [program or find_espeak(), "-q", "--ipa", "-v", voice],
            input=text.replace("\n", " ").encode("utf-8"),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run killed and reaped it
        raise PhonemizerError(f"{ESPEAK} took over {timeout_s} s on {text[:40]!r}") from exc
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()
        raise PhonemizerError(f"{ESPEAK} failed ({done.returncode}): {message}")
    clauses = [line.strip() for line in done.stdout.decode("utf-8").splitlines() if line.strip()]
    ending = _CLAUSE_END.search(text.strip())
    return ", ".join(clauses) + (ending.group(0).strip() if ending else "")


def phoneme_ids(ipa: str, symbols: VoiceSymbols) -> list[int]:
    """Piper's input ids: ^ _ (phoneme _)* $ ; symbols the voice lacks are skipped."""
    ids = [symbols.begin, symbols.pad]
    for char in unicodedata.normalize("NFD", ipa):
        symbol = symbols.ids.get(char)
        if symbol is not None:
            ids += [symbol, symbols.pad]
    ids.append(symbols.end)
    return ids
