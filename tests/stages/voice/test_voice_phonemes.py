"""espeak-ng as a trust boundary (stages/voice/phonemes.py) and the TTS step's error
isolation (stages/voice/tts.py): the round-3 phonemizer attacks, on the real espeak-ng
and the real Piper voice."""

from __future__ import annotations

import psutil
import pytest

from omnitrio import Request, StreamWork
from stages.voice import phonemes
from stages.voice.payloads import TextPiece
from stages.voice.phonemes import (
    MAX_DOTTED_LETTERS,
    MAX_PHRASE_CHARS,
    MAX_WORD_CHARS,
    Espeak,
    PhonemizerError,
    VoiceSymbols,
    espeak_text,
    phoneme_ids,
)
from stages.voice.phrases import PhraseSplitter
from stages.voice.tts import PiperTts

GREETING = "Good morning to you."
CRASH = "W." * 100  # espeak-ng 1.51: "stack smashing detected", SIGABRT


_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _espeaks_before() -> None:
    """The espeak-ng processes other tests' voices hold (each its next phrase's)."""
    _BEFORE.clear()
    _BEFORE.update(p.pid for p in _espeaks())


def _espeaks() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children():
        try:
            if child.name().startswith("espeak"):
                found.append(child)
        except psutil.NoSuchProcess:  # ended meanwhile
            continue
    return found


def _espeak_children() -> list[psutil.Process]:
    """The espeak-ng processes started since the test began and still running."""
    return [p for p in _espeaks() if p.pid not in _BEFORE]


def _alone(text: str) -> str:
    """``text``'s IPA from a process of its own, the reference."""
    espeak = Espeak("en-us", 10.0)
    try:
        return espeak.ipa(text)
    finally:
        espeak.close()


def test_a_phrase_built_to_straddle_espeaks_input_pieces_reaches_no_other_request() -> None:
    """Round 3, row 3: ", xylophone" (the old sentinel word) ending at byte 999, 999
    dots, then a command; the next request must hear only itself (with the shared
    process, it heard "open the pod bay doors")."""
    tail = ", xylophone"
    lead = ("la " * ((999 - len(tail)) // 3)).strip()
    lead += "a" * (999 - len(tail) - len(lead)) + tail  # one line: espeak-ng's first piece
    assert len(lead.encode()) == 999
    attack = lead + "." * 999 + " open the pod bay doors"
    espeak = Espeak("en-us", 10.0)
    try:
        espeak.ipa(attack)
        heard = [espeak.ipa(GREETING) for _ in range(3)]
    finally:
        espeak.close()
    assert heard == [_alone(GREETING)] * 3
    assert _alone("pod bay doors").split()[0] not in heard[0]  # no "pod bay doors"
    assert not _espeak_children()


def test_the_abort_fails_only_its_phrase_and_the_sanitised_text_does_not_abort() -> None:
    espeak = Espeak("en-us", 10.0)
    try:
        with pytest.raises(PhonemizerError) as caught:
            espeak._run(CRASH)  # the raw text, past the sanitiser: espeak-ng aborts
        assert "W." not in str(caught.value)  # the message holds none of the text
        assert espeak.ipa(GREETING) == _alone(GREETING)  # the next phrase: its own process
        assert espeak.ipa(CRASH)  # sanitised: spoken, no abort
        assert espeak.ipa("e.g. " * 60)
    finally:
        espeak.close()
    assert not _espeak_children()


def test_espeak_text_is_bounded_and_sanitised() -> None:
    assert espeak_text("a\x00b\u202ec\u200b [[h@l'oU]]\nnext") == "abc h@l'oU next"
    long = espeak_text("x" * (3 * MAX_WORD_CHARS))
    assert max(len(word) for word in long.split()) == MAX_WORD_CHARS
    dotted = espeak_text("W." * (3 * MAX_DOTTED_LETTERS))
    assert dotted.count(",") == 3
    assert len(espeak_text("word " * 1000)) <= MAX_PHRASE_CHARS
    assert espeak_text("Dr. Smith met U.S.A. officials, e.g. at 9.30.") == (
        "Dr. Smith met U.S.A. officials, e.g. at 9.30."
    )


def test_phoneme_ids_are_capped_at_a_word() -> None:
    symbols = PiperTts("tts").symbols
    ipa = " ".join([_alone(GREETING)] * 50)
    whole, cut = phoneme_ids(ipa, symbols), phoneme_ids(ipa, symbols, max_ids=100)
    assert len(cut) <= 100
    assert cut[-1] == symbols.end
    assert cut[:-1] == whole[: len(cut) - 1]  # a prefix of the whole...
    assert whole[len(cut) - 1] == symbols.ids[" "]  # ...that ends at a word


def test_one_streams_espeak_crash_fails_only_that_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Round 3, row 4: "W." x 100 beside three other answers. The sanitiser is taken
    out, so the real espeak-ng really aborts on it; the other three are spoken."""
    monkeypatch.setattr(phonemes, "espeak_text", lambda text: " ".join(text.split()))
    tts = PiperTts("tts")
    texts = {"a": "Cats like fish.", "b": CRASH, "c": "The sky is blue.", "d": GREETING}
    for stream_id in texts:
        tts.open_stream(stream_id, Request())
    batch = [StreamWork(sid, (TextPiece(text),), True) for sid, text in texts.items()]
    spoken: dict[str, int] = dict.fromkeys(texts, 0)
    failed: dict[str, Exception] = {}
    for _ in range(8):
        outputs = tts.step([work for work in batch if work.stream_id not in failed])
        for stream_id, output in outputs.items():
            if output.error is not None:
                failed[stream_id] = output.error
            spoken[stream_id] += sum(len(chunk.pcm16) for chunk in output.visible)
        batch = [StreamWork(work.stream_id, (), True) for work in batch]
    tts.close()
    assert list(failed) == ["b"]
    assert isinstance(failed["b"], PhonemizerError)
    assert all(spoken[stream_id] > 22050 for stream_id in "acd")  # each at least 0.5 s
    assert not _espeak_children()


def test_a_word_of_emoji_is_spoken_within_the_phoneme_cap() -> None:
    """Round 3, row 5 (the TTS half): espeak names each emoji, so one "word" of them was
    ~11k ids in one Piper call; now at most ``max_phoneme_ids``."""
    tts = PiperTts("tts", max_phoneme_ids=400)
    symbols: VoiceSymbols = tts.symbols
    ids, _ = tts.voice.inputs("\U0001f600" * 60)
    assert ids.shape[1] <= 400
    assert ids[0, -1] == symbols.end
    tts.close()


def test_a_phrase_at_the_phoneme_cap_leaves_no_peak_behind() -> None:
    """Round 3, row 4: a phrase at ``max_phoneme_ids`` needs ~0.5 GB while Piper runs;
    onnxruntime's arena kept it all after (+523-529 MB), without it +3-31 MB."""
    tts = PiperTts("tts")
    try:
        tts.synthesize(GREETING, noise=False)
        ids, _ = tts.voice.inputs("W. " * 100)
        assert ids.shape[1] > tts.max_phoneme_ids - 40  # cut at the cap (at a word)
        before = psutil.Process().memory_info().rss
        for _ in range(2):
            tts.synthesize("W. " * 100, noise=False)
        kept_mb = (psutil.Process().memory_info().rss - before) / 2**20
    finally:
        tts.close()
    assert kept_mb < 300


def test_no_espeak_is_left_waiting_after_close() -> None:
    espeak = Espeak("en-us", 10.0)
    espeak.ipa(GREETING)
    assert len(_espeak_children()) == 1  # the next phrase's, started
    espeak.close()
    assert not _espeak_children()


def test_a_long_word_is_cut_into_phrases_of_bounded_characters() -> None:
    """Round 3, row 5 (the phrase half): one "word" of 700 emoji, a token at a time."""
    splitter = PhraseSplitter()
    phrases = [p for _ in range(700) for p in splitter.feed("\U0001f600")]
    rest = splitter.flush()
    assert rest is not None
    assert [len(p) for p in phrases] == [splitter.max_chars] * 2
    assert len(rest) == 700 - 2 * splitter.max_chars
    words = PhraseSplitter(max_chars=30).feed("one two three four five six seven eight. ")
    assert [len(p) <= 30 for p in words] == [True, True]  # cut at a space within the limit
