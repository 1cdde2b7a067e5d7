"""Word joins the voice runs together, kept apart at the phoneme level.

The Piper voice runs a word ending in a sibilant into an unstressed word that starts
with a vowel: "France is" (espeak-ng's IPA: the /s/ of "France", a space, then an
unstressed /Iz/) comes out as one word, heard as "Francis" by Whisper (tiny.en and
base) at any noise or length scale, the noise off included: it is the join, not the
sampled noise. Giving the second word a secondary stress makes the voice start it as
a word of its own (its vowel not reduced into the first word's last syllable), which
is how it is said with care, and leaves every other word as espeak-ng gave it. A
word of one vowel and nothing else ("a") is left alone: "is a" is said as one.
"""

from __future__ import annotations

import re

SIBILANTS = "sz\u0283\u0292"
"""Last phonemes that run into a following vowel: s, z, esh, ezh (the affricates of
"church" and "judge" end in the last two)."""
VOWELS = (
    "aeiou\u00e6\u0251\u0252\u0254\u0259\u025b\u025c\u026a\u028a\u028c\u1d7b\u0250"
    "\u025a\u025d\u0258\u0275\u0268\u0289y\u00f8\u0153"
)
"""espeak-ng's IPA vowels: a word starting with one has no onset of its own."""
PRIMARY_STRESS, SECONDARY_STRESS, LONG = "\u02c8", "\u02cc", "\u02d0"

_STRESS = PRIMARY_STRESS + SECONDARY_STRESS
_NOT_CONSONANT = rf"{VOWELS}\s{_STRESS}{LONG}.,;:!?"
_RUN_TOGETHER = re.compile(
    rf"(?<=[{SIBILANTS}]) "
    rf"(?=[{VOWELS}][^\s{_STRESS}]*[^{_NOT_CONSONANT}][^\s{_STRESS}]*(?:\s|$))"
)
"""A space after a sibilant, before a vowel-initial word that has a consonant and no
stress mark."""


def keep_words_apart(ipa: str) -> str:
    """``ipa`` (espeak-ng's, words split by spaces) with each unstressed vowel-initial
    word after a sibilant given a secondary stress."""
    return _RUN_TOGETHER.sub(" " + SECONDARY_STRESS, ipa)
