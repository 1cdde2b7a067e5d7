"""Text to Piper phoneme ids, with espeak-ng run as a separate program.

espeak-ng is GPL-3.0, so it never runs inside the omnitrio process; and it is a C
parser of client text with memory-safety bugs (espeak-ng 1.51 aborts, "stack smashing
detected", on ~90 dotted letters: "W.W.W..."), so it is a trust boundary:

- **One process per phrase** (``Espeak``): each phrase is written to its own
  ``espeak-ng -q --ipa`` process, whose whole output (to its exit) is that phrase's
  IPA. No process sees two phrases, so no phrase's text or IPA can reach another
  request, whatever the text (a shared process, framed by a sentinel word, gave one
  client another's phrase: espeak reads its input in 999-byte pieces and answers each
  apart). The next phrase's process is started as each phrase is sent, so its start
  (~10 ms) is off the next phrase's path. A process that fails, or runs past the
  timeout and is killed, fails only its own phrase (``PhonemizerError``, whose message
  holds none of the text).
- **Text bounded and sanitised first** (``espeak_text``): at most
  ``MAX_PHRASE_CHARS``; control, format, private-use and unassigned code points
  dropped; brackets (espeak's ``[[phoneme]]`` input) spaced out; a "word" longer than
  ``MAX_WORD_CHARS`` split; a run of dotted letters broken by commas every
  ``MAX_DOTTED_LETTERS``.

The IPA is mapped to the voice's symbol ids the way Piper does: NFD-normalised code
points, each followed by the pad symbol, between the begin and end symbols, at most
``max_ids`` of them (``phoneme_ids``: a phrase of emoji, each named by espeak, is cut
there, at a word).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ESPEAK = "espeak-ng"
INSTALL_ESPEAK = "install espeak-ng (Debian/Ubuntu: apt-get install espeak-ng)"
_CLAUSE_END = re.compile(r"[.!?;:,]\s*$")
logger = logging.getLogger(__name__)

MAX_PHRASE_CHARS = 600
"""Characters of one phrase espeak-ng sees (phrases.py cuts phrases well below it)."""
MAX_WORD_CHARS = 40
"""A longer run of non-space characters is split into pieces of this many."""
MAX_DOTTED_LETTERS = 8
"""Dotted letters ("e.g.", "W.") in a row before a comma breaks the run: espeak-ng
1.51 joins them into one abbreviation and overflows a buffer past ~85."""
_DROPPED_CATEGORIES = frozenset(["Cc", "Cf", "Cs", "Co", "Cn"])
_DOTTED_LETTER = re.compile(r"(?<![^\W\d_])[^\W\d_]\.\s?")
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARS + 1},}}")


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


def espeak_text(text: str) -> str:
    """``text`` as espeak-ng may see it (see the module docstring): one line, at most
    ``MAX_PHRASE_CHARS``, no code point it should not parse."""
    kept = "".join(
        " " if char in "[]" or char.isspace() else char
        for char in unicodedata.normalize("NFC", text)
        if char.isspace() or unicodedata.category(char) not in _DROPPED_CATEGORIES
    )
    kept = _LONG_WORD.sub(_split_word, kept)
    kept = _break_dotted_runs(kept)
    line = " ".join(kept.split())
    if len(line) > MAX_PHRASE_CHARS:
        logger.warning("a phrase of %d characters cut to %d", len(line), MAX_PHRASE_CHARS)
        line = line[:MAX_PHRASE_CHARS].rsplit(" ", 1)[0]
    return line


def _split_word(word: re.Match[str]) -> str:
    run = word.group()
    return " ".join(
        run[start : start + MAX_WORD_CHARS] for start in range(0, len(run), MAX_WORD_CHARS)
    )


def _break_dotted_runs(text: str) -> str:
    out: list[str] = []
    num_in_row, end = 0, 0
    for letter in _DOTTED_LETTER.finditer(text):
        num_in_row = num_in_row + 1 if letter.start() == end else 1
        out.append(text[end : letter.end()])
        if num_in_row == MAX_DOTTED_LETTERS:
            out.append(", ")
            num_in_row = 0
        end = letter.end()
    out.append(text[end:])
    return "".join(out)


class Espeak:
    """espeak-ng for one voice: one process per phrase (see the module docstring)."""

    def __init__(self, voice: str, timeout_s: float) -> None:
        self.program = find_espeak()  # fail at load, not at the first answer
        self.voice = voice
        self.timeout_s = timeout_s
        self._next: subprocess.Popen[bytes] | None = None
        self.num_started = 0

    def ipa(self, text: str) -> str:
        """IPA for ``text`` (sanitised first); clauses joined by the text's punctuation."""
        line = espeak_text(text)
        raw = self._run(line).decode("utf-8", "replace")
        clauses = [clause.strip() for clause in raw.splitlines() if clause.strip()]
        ending = _CLAUSE_END.search(line)
        return ", ".join(clauses) + (ending.group(0).strip() if ending else "")

    def _run(self, line: str) -> bytes:
        """The whole output of one process given ``line``; the next one starts now."""
        process, self._next = self._next or self._start(), None
        try:
            out, _ = process.communicate(f"{line}\n".encode(), timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise PhonemizerError(
                f"{ESPEAK} took over {self.timeout_s} s on a phrase of {len(line)} characters"
            ) from None
        except OSError as exc:
            process.kill()
            process.wait()
            raise PhonemizerError(f"{ESPEAK} could not be run: {exc}") from None
        finally:
            self._next = self._start()
        if process.returncode != 0:
            raise PhonemizerError(
                f"{ESPEAK} failed (exit {process.returncode}) on a phrase of {len(line)} characters"
            )
        return out

    def _start(self) -> subprocess.Popen[bytes]:
        try:
            process = subprocess.Popen(
                [self.program, "-q", "--ipa", "-v", self.voice],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise PhonemizerError(f"{ESPEAK} could not be started: {exc}") from None
        self.num_started += 1
        return process

    def close(self) -> None:
        """End the waiting process (idempotent); the next phrase would start a new one."""
        process, self._next = self._next, None
        if process is not None:
            process.kill()
            process.communicate()


def phoneme_ids(ipa: str, symbols: VoiceSymbols, max_ids: int | None = None) -> list[int]:
    """Piper's input ids: ^ _ (phoneme _)* $ ; symbols the voice lacks are skipped.
    With ``max_ids``, at most that many: the IPA is cut after its last whole word
    that fits (or mid-word, if its first word alone does not)."""
    ids = [symbols.begin, symbols.pad]
    word_end = len(ids)
    space = symbols.ids.get(" ")
    for char in unicodedata.normalize("NFD", ipa):
        symbol = symbols.ids.get(char)
        if symbol is None:
            continue
        if max_ids is not None and len(ids) + 3 > max_ids:
            ids = ids[: word_end if word_end > 2 else len(ids)]
            logger.warning("a phrase's phonemes cut at %d ids", max_ids)
            break
        if symbol == space:
            word_end = len(ids)
        ids += [symbol, symbols.pad]
    ids.append(symbols.end)
    return ids
