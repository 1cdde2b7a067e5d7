"""Cutting streamed answer text into phrases to speak, so speech starts early.

Text arrives a token at a time. A phrase ends at a sentence end (. ! ? ; :
followed by a space), at a comma once the phrase has ``min_comma_words``
words, or at a space once it has ``max_words`` (``first_max_words`` for the
first phrase: the sooner it is out, the sooner the answer is heard); whatever
is left is spoken when the text ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SENTENCE_END = re.compile(r"[.!?;:]\s")
_COMMA = re.compile(r",\s")


@dataclass
class PhraseSplitter:
    min_comma_words: int = 4
    max_words: int = 24
    first_max_words: int = 24
    _text: str = field(default="", repr=False)
    _num_phrases: int = field(default=0, repr=False)

    def feed(self, text: str) -> list[str]:
        """Append ``text``; return the phrases now complete (possibly none)."""
        self._text += text
        phrases: list[str] = []
        while (cut := self._cut()) is not None:
            phrase, self._text = self._text[:cut].strip(), self._text[cut:]
            if phrase:
                phrases.append(phrase)
                self._num_phrases += 1
        return phrases

    def flush(self) -> str | None:
        """The rest of the text as a last phrase (None if there is nothing to say)."""
        rest, self._text = self._text.strip(), ""
        return rest or None

    def _cut(self) -> int | None:
        sentence = _SENTENCE_END.search(self._text)
        if sentence:
            return sentence.end()
        for comma in _COMMA.finditer(self._text):
            if len(self._text[: comma.start()].split()) >= self.min_comma_words:
                return comma.end()
        limit = self.max_words if self._num_phrases else self.first_max_words
        words = list(re.finditer(r"\S+\s", self._text))
        if len(words) >= limit:
            return words[limit - 1].end()
        return None
