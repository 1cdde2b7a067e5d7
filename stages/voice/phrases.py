"""Cutting streamed answer text into phrases to speak, so speech starts early.

Text arrives a token at a time. A phrase ends at a sentence end (. ! ? ; :
followed by a space (below: or none), not after an abbreviation such as "Dr." or an initial), at
a comma once the phrase has ``min_comma_words`` words (either of them also where a
closing quote or bracket comes between it and the space: ``"Lady in Red." It``; the
LLM quotes names it suggests, and a phrase that ran on past them to the next comma
was the answer's audio running dry), or once it has
``max_words`` words (``first_max_words`` for the first phrase: the sooner it is
out, the sooner the answer is heard). The first phrase also ends before a
boundary word (below) that comes once it has ``first_min_words`` words, without
waiting for ``first_max_words``. A cut for length falls at a prosodic
boundary where there is one — before a conjunction, preposition or relative
word, never leaving fewer than two words — because Piper speaks each phrase on
its own and a cut inside a tight word group ("France | is Paris") blurs the
words either side of the join. With ``first_boundary_min_words`` (M), the first
phrase's cut for length never falls before a boundary word that would leave it fewer
than M words ("A good name | for a small dog could" left a first phrase no longer than
its first part, with the whole wait for the second phrase behind it). Whatever is left
is spoken when the text ends.

A sentence's end that needs no space after it to be sure of ends a phrase as soon as
it comes, not when the next token brings the space (``ends_sentence_now``): a ``!`` or
``?``, or a full stop after a word of letters that is not an abbreviation or an
initial. The LLM writes "Luna" "." " The" as three tokens, and at four conversations
the next one came ~0.1-0.4 s later, the answer's audio running dry meanwhile. Never
after a number ("3." "5") or a letter ("e." "g."); SmolLM2's tokenizer also writes
"example" "." "com", so a name with a dot inside may be spoken in two phrases.

A phrase is also at most ``max_chars`` characters, however few its words: a
"word" of 700 emoji (each named by espeak-ng) was one phrase of ~11k phonemes,
one Piper call of gigabytes; it is cut after the last space within the limit, or
at the limit inside a word (tts.py caps the phonemes of what is left).

With ``first_part_words`` (K), the first phrase's first K words are also offered on
their own as soon as they are known (``first_part``), while the phrase is still being
written: the TTS speaks their start from a pass over them and goes on across the join
when the phrase is complete (tts.py). Once they are offered, the first phrase is never
cut shorter than K words, so it always holds them and more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_CLOSING = "[\"'\u201d\u2019)\\]]*"  # what may close after a sentence's end or a comma
_SENTENCE_END = re.compile(r"(\S*?)[.!?;:]" + _CLOSING + r"\s")
_COMMA = re.compile("," + _CLOSING + r"\s")
_WORD = re.compile(r"\S+\s")
_PIECE = re.compile(r"\s*\S*\s?")
_CLOSERS = "\"'\u201d\u2019)]"  # _CLOSING's characters
_OPENERS = "\"'(\u201c\u2018["
_PUNCTUATION = frozenset(".!?;:,\u2026" + _CLOSERS + _OPENERS)
_LETTERS = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")  # "Luna", "don't", "well-known"
NOT_SENTENCE_ENDS = frozenset(["www"])  # a full stop after it goes on ("www.example")
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
    first_part_words: int | None = None  # None: the first phrase is offered only whole
    first_boundary_min_words: int | None = None  # None: a length cut leaves MIN_WORDS
    max_chars: int = 240  # a phrase, at most: a long "word" (emoji, a URL) is cut too
    _text: str = field(default="", repr=False)
    _num_phrases: int = field(default=0, repr=False)
    _part_offered: bool = field(default=False, repr=False)
    _part: str | None = field(default=None, repr=False)

    def first_part(self) -> str | None:
        """The first phrase's first ``first_part_words`` words, once, if they were known
        whole before the first phrase was complete (None otherwise)."""
        part, self._part = self._part, None
        return part if not self._num_phrases else None

    def feed(self, text: str) -> list[str]:
        """Append ``text``; return the phrases now complete (possibly none)."""
        phrases: list[str] = []
        for piece in _PIECE.findall(text):  # a word at a time: the part is seen first
            self._text += piece
            self._offer_part()
            while (cut := self._cut()) is not None:
                phrase, self._text = self._text[:cut].strip(), self._text[cut:]
                if says_something(phrase):  # not "!" or a closing quote a token late
                    phrases.append(phrase)
                    self._num_phrases += 1
        return phrases

    def _offer_part(self) -> None:
        k = self.first_part_words
        if k is None or self._num_phrases or self._part_offered:
            return
        words = list(_WORD.finditer(self._text))
        if len(words) >= k:
            self._part_offered = True
            self._part = self._text[: words[k - 1].end()].strip()

    def cut_first(self) -> str | None:
        """The first phrase cut now, after its last whole word, if it is still open, its
        first part was offered and it holds that part's words (None otherwise): for when
        its first part's audio would run out before the phrase is complete."""
        if self._num_phrases or not self._part_offered:
            return None
        words = list(_WORD.finditer(self._text))
        if len(words) < (self.first_part_words or 0):
            return None
        cut = words[-1].end()
        phrase, self._text = self._text[:cut].strip(), self._text[cut:]
        self._num_phrases += 1
        return phrase

    def cut_later(self) -> str | None:
        """A later phrase cut now, if it is open and holds ``MIN_WORDS`` whole words:
        before its last boundary word that leaves ``MIN_WORDS`` before it, else after its
        last whole word (None otherwise): for when the answer's audio would run out
        before the phrase is complete."""
        if not self._num_phrases:
            return None
        words = list(_WORD.finditer(self._text))
        if len(words) < MIN_WORDS:
            return None
        cut = words[-1].end()
        for word in reversed(words[MIN_WORDS:]):
            if word.group().strip().lower() in BOUNDARY_WORDS:
                cut = word.start()  # the boundary word opens the next phrase
                break
        phrase, self._text = self._text[:cut].strip(), self._text[cut:]
        self._num_phrases += 1
        return phrase

    def flush(self) -> str | None:
        """The rest of the text as a last phrase (None if there is nothing to say)."""
        rest, self._text = self._text.strip(), ""
        return rest if says_something(rest) else None

    def _cut(self) -> int | None:
        for sentence in _SENTENCE_END.finditer(self._text):
            if not is_abbreviation(sentence.group(1)):
                return sentence.end()
        if ends_sentence_now(self._text):
            return len(self._text)
        for comma in _COMMA.finditer(self._text):
            if len(self._text[: comma.start()].split()) >= self.min_comma_words:
                return comma.end()
        limit = self.max_words if self._num_phrases else self.first_max_words
        words = list(_WORD.finditer(self._text))
        early = None if self._num_phrases else self.first_min_words
        shortest = MIN_WORDS
        if self._part_offered and not self._num_phrases:
            shortest = max(shortest, self.first_part_words or 0)  # it holds the part's words
            limit = max(limit, shortest + 1)
        if not self._num_phrases and self.first_boundary_min_words is not None:
            shortest = max(shortest, self.first_boundary_min_words)
        if early is not None:
            for word in words[max(early, shortest) : limit]:
                if word.group().strip().lower() in BOUNDARY_WORDS:
                    return word.start()  # the boundary word opens the next phrase
        if len(words) < limit:
            return self._cut_for_chars()
        for index in range(limit - 1, shortest - 1, -1):
            if words[index].group().strip().lower() in BOUNDARY_WORDS:
                return words[index].start()  # the boundary word opens the next phrase
        return words[limit - 1].end()

    def _cut_for_chars(self) -> int | None:
        """Past ``max_chars``: after the last space within them, or at them."""
        if len(self._text) <= self.max_chars:
            return None
        space = self._text.rfind(" ", 0, self.max_chars)
        return space + 1 if space > 0 else self.max_chars


def ends_sentence_now(text: str) -> bool:
    """``text`` ends at a sentence's end that needs no space after it to be sure of: a
    ``!`` or ``?`` after a word, or a full stop after a word of two or more letters
    (an apostrophe or hyphen inside) that is not an abbreviation, with what may close
    after it. Not a full stop after a digit ("3." may go on to "3.5"), a single letter
    ("e." to "e.g."), another full stop ("U.S", "..."), "www", an abbreviation, or a
    capitalised word of two letters ("Ph." may go on to "Ph.D.", "Mt." to "Mt. Fuji")."""
    bare = text.rstrip(_CLOSERS)
    if not bare or bare[-1] not in ".!?":
        return False
    word = bare[:-1].rsplit(None, 1)[-1].lstrip(_OPENERS) if bare[:-1].strip() else ""
    if bare[-1] != ".":
        return any(c.isalnum() for c in word)
    return (
        _LETTERS.fullmatch(word) is not None
        and not is_abbreviation(word)
        and word.lower() not in NOT_SENTENCE_ENDS
        and not (len(word) <= 2 and word[0].isupper())
    )


def says_something(phrase: str) -> bool:
    """``phrase`` is more than sentence punctuation, quotes and brackets: a sentence end
    cut as it comes can leave what its next token brings ("!", a closing quote, "..")
    with nothing to say, which is dropped rather than synthesised alone."""
    return any(not c.isspace() and c not in _PUNCTUATION for c in phrase)


def is_abbreviation(word: str) -> bool:
    """``word`` (what precedes a full stop) is an abbreviation or an initial."""
    bare = word.lower().strip("\"'(")
    return bare in ABBREVIATIONS or (len(bare) == 1 and bare.isalpha())
