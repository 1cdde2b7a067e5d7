"""Cutting streamed answer text into phrases to speak, so speech starts early.

Text arrives a token at a time. A phrase ends at a sentence end (. ! ? ; :
followed by a space, not after an abbreviation such as "Dr." or an initial), at
a comma once the phrase has ``min_comma_words`` words, or once it has
``max_words`` words (``first_max_words`` for the first phrase: the sooner it is
out, the sooner the answer is heard). The first phrase also ends before a
boundary word (below) that comes once it has ``first_min_words`` words, without
waiting for ``first_max_words``. A cut for length falls at a prosodic
boundary where there is one — before a conjunction, preposition or relative
word, never leaving fewer than two words — because Piper speaks each phrase on
its own and a cut inside a tight word group ("France | is Paris") blurs the
words either side of the join. Whatever is left is spoken when the text ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SENTENCE_END = re.compile(r"(\S*)[.!?;:]\s")
_COMMA = re.compile(r",\s")
_WORD = re.compile(r"\S+\s")
ABBREVIATIONS = frozenset(
    ["mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "prof", "inc", "ltd"]
)
BOUNDARY_WORDS = frozenset(
    [
        "and",
        "but",
        "or",
        "so",
        "because",
        "since",
        "although",
        "though",
        "while",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "that",
        "if",
        "unless",
        "until",
        "than",
        "then",
        "of",
        "for",
        "to",
        "in",
        "on",
        "at",
        "with",
        "from",
        "by",
        "about",
        "into",
        "over",
        "under",
        "after",
        "before",
        "during",
        "without",
        "through",
        "between",
    ]
)
MIN_WORDS = 2  # a cut for length never leaves a phrase shorter than this


@dataclass
class PhraseSplitter:
    min_comma_words: int = 4
    max_words: int = 24
    first_max_words: int = 24
    first_min_words: int | None = None  # None: the first phrase waits for first_max_words
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
        for sentence in _SENTENCE_END.finditer(self._text):
            if not is_abbreviation(sentence.group(1)):
                return sentence.end()
        for comma in _COMMA.finditer(self._text):
            if len(self._text[: comma.start()].split()) >= self.min_comma_words:
                return comma.end()
        limit = self.max_words if self._num_phrases else self.first_max_words
        words = list(_WORD.finditer(self._text))
        early = None if self._num_phrases else self.first_min_words
        if early is not None:
            for word in words[max(early, MIN_WORDS) : limit]:
                if word.group().strip().lower() in BOUNDARY_WORDS:
                    return word.start()  # the boundary word opens the next phrase
        if len(words) < limit:
            return None
        for index in range(limit - 1, MIN_WORDS - 1, -1):
            if words[index].group().strip().lower() in BOUNDARY_WORDS:
                return words[index].start()  # the boundary word opens the next phrase
        return words[limit - 1].end()


def is_abbreviation(word: str) -> bool:
    """``word`` (what precedes a full stop) is an abbreviation or an initial."""
    bare = word.lower().strip("\"'(")
    return bare in ABBREVIATIONS or (len(bare) == 1 and bare.isalpha())
