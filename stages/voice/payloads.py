"""What the voice-chat stages send one another, on the edges asr -> llm -> tts only;
clients never see them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Utterance:
    """asr -> llm: what the user said in this turn ("" when the turn had no audio)."""

    text: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    """llm -> tts: the next piece of the answer's text, in order."""

    text: str
