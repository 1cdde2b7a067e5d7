"""What the voice-chat stages send one another, on the edges asr -> llm -> tts only;
clients never see them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Utterance:
    """asr -> llm: what the user said in this turn ("" when the turn had no audio)."""

    text: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    """llm -> tts: the next piece of the answer's text, in order."""

    text: str
    written_s: float = field(default_factory=time.monotonic, compare=False)
    """When the LLM stage handed it on (``time.monotonic``; the TTS's trace: how long
    after it the TTS had it)."""
