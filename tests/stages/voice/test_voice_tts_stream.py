"""An answer's first phrase spoken in parts (first_chunk_frames): the first part goes
out a step before the rest, and the parts join into the one-pass audio."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omnitrio import AudioChunk, Request, StreamWork
from tests.voice_support import needs_voice

PHRASE = "Cats like to eat fish and chicken."
FIRST_FRAMES = 24


@pytest.fixture
def tts(tmp_path: Path) -> Iterator[object]:
    from stages.voice.tts import PiperTts

    stage = PiperTts("tts", first_chunk_frames=FIRST_FRAMES, cache_dir=str(tmp_path))
    yield stage
    stage.close()


@needs_voice
@pytest.mark.parametrize("first_frames", [16, 24, 32, 40])
@pytest.mark.parametrize(
    "text", [PHRASE, "The capital of France is Paris.", "She reads a book every night."]
)
def test_the_parts_join_into_the_one_pass_audio(tts: object, text: str, first_frames: int) -> None:
    """With the default margins (20 frames of look-ahead, 24 of context: narrower than
    the vocoder's field on paper), the parts still add up to the voice's one pass."""
    from stages.voice.tts import PiperTts

    assert isinstance(tts, PiperTts)
    assert tts.voice.split is not None
    assert (tts.voice.split.right_frames, tts.voice.split.left_frames) == (20, 24)
    whole = tts.synthesize(text, noise=False)  # the voice's own graph, no sampled noise
    phrase = tts.voice.split.front(*tts.voice.inputs(text, noise=False))
    first = tts.voice.split.speak(phrase, first_frames)
    rest = tts.voice.split.speak(phrase, phrase.num_frames)
    assert first.size == first_frames * tts.voice.split.hop
    joined = np.concatenate([first, rest])
    assert joined.size == whole.size
    np.testing.assert_allclose(joined, whole, atol=2e-3)


@needs_voice
def test_a_margin_narrower_than_the_field_that_matters_does_not_join(tts: object) -> None:
    """What the test above would catch: with 8 frames of look-ahead the first part's
    last frames are audibly off the one pass."""
    split = tts.voice.split  # type: ignore[attr-defined]
    whole = tts.synthesize(PHRASE, noise=False)  # type: ignore[attr-defined]
    phrase = split.front(*tts.voice.inputs(PHRASE, noise=False))  # type: ignore[attr-defined]
    split.right_frames = 8
    first = split.speak(phrase, 32)
    assert np.abs(first - whole[: first.size]).max() > 2e-2


@needs_voice
@pytest.mark.parametrize("param", ["chunk_left_frames", "chunk_right_frames"])
def test_a_negative_margin_is_refused(param: str) -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match=f"{param} must not be negative, got -1"):
        PiperTts("tts", first_chunk_frames=32, **{param: -1})  # type: ignore[arg-type]


@needs_voice
def test_pausing_the_answer_needs_a_first_part() -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match="first_part_pauses_answer needs first_part_words"):
        PiperTts("tts", first_chunk_frames=32, first_part_pauses_answer=True)


@needs_voice
def test_the_first_part_goes_out_a_step_before_the_rest(tts: object) -> None:
    from stages.voice.payloads import TextPiece

    tts.open_stream("s", Request())  # type: ignore[attr-defined]
    text = (TextPiece(PHRASE), TextPiece(" Dogs like bones too."))
    outputs = [tts.step([StreamWork("s", text, True)])["s"]]  # type: ignore[attr-defined]
    while not outputs[-1].done:
        outputs.append(tts.step([StreamWork("s", (), True)])["s"])  # type: ignore[attr-defined]
    tts.close_stream("s")  # type: ignore[attr-defined]
    chunks = [item for out in outputs for item in out.visible if isinstance(item, AudioChunk)]
    assert len(chunks) == 3  # the first phrase in two parts, the second whole
    first_samples = FIRST_FRAMES * tts.voice.split.hop  # type: ignore[attr-defined]
    quiet_start = int(0.06 * 22050)  # cut from an answer's first audio (pcm.without_quiet_start)
    assert 2 * (first_samples - quiet_start) <= len(chunks[0].pcm16) <= 2 * first_samples
    assert outputs[0].more
    assert len(chunks[1].pcm16) > len(chunks[0].pcm16)


@needs_voice
def test_a_first_phrase_too_short_to_gain_from_parts_is_spoken_whole(tmp_path: Path) -> None:
    """A part computes right_frames past its end: a first phrase no longer than the
    first part and that is made in one pass, not twice."""
    from stages.voice.payloads import TextPiece
    from stages.voice.tts import PiperTts

    tts = PiperTts(
        "tts", first_chunk_frames=FIRST_FRAMES, chunk_right_frames=40, cache_dir=str(tmp_path)
    )
    tts.open_stream("s", Request())  # type: ignore[attr-defined]
    text = (TextPiece("Yes."), TextPiece(" Dogs like bones too."))
    outputs = [tts.step([StreamWork("s", text, True)])["s"]]  # type: ignore[attr-defined]
    while not outputs[-1].done:
        outputs.append(tts.step([StreamWork("s", (), True)])["s"])  # type: ignore[attr-defined]
    tts.close_stream("s")  # type: ignore[attr-defined]
    chunks = [item for out in outputs for item in out.visible if isinstance(item, AudioChunk)]
    assert len(chunks) == 2  # each phrase whole
    split = tts.voice.split  # type: ignore[attr-defined]
    assert len(chunks[0].pcm16) > 2 * FIRST_FRAMES * split.hop
    assert len(chunks[0].pcm16) <= 2 * (FIRST_FRAMES + split.right_frames) * split.hop
    tts.close()


@needs_voice
def test_a_non_positive_first_chunk_is_refused() -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match="first_chunk_frames must be positive or null, got 0"):
        PiperTts("tts", first_chunk_frames=0)


@needs_voice
def test_the_first_phrase_marks_the_stream_as_speaking_until_it_closes(tts: object) -> None:
    """What first_audio.py's hold reads: a stream is speaking once its first phrase is
    synthesised, and forgotten when it closes."""
    from stages.voice.first_audio import FIRST_AUDIO
    from stages.voice.payloads import TextPiece

    tts.open_stream("m", Request())  # type: ignore[attr-defined]
    assert not FIRST_AUDIO.speaking("m")
    tts.step([StreamWork("m", (TextPiece(PHRASE),), True)])  # type: ignore[attr-defined]
    assert FIRST_AUDIO.speaking("m")
    tts.close_stream("m")  # type: ignore[attr-defined]
    assert not FIRST_AUDIO.speaking("m")


def test_word_starts_come_from_the_durations() -> None:
    """A word begins where the space before it begins: the frames of every id before it."""
    from stages.voice.tts_stream import word_starts, words_of

    space = 3
    ids = [1, 0, 20, 0, 21, 0, space, 0, 22, 0, space, 0, 23, 0, 2]
    durations = np.array([0, 1, 5, 2, 4, 1, 3, 1, 6, 2, 1, 0, 7, 2, 0])
    assert word_starts(ids, durations, space) == [0, 13, 25]
    assert words_of(ids, space) == [(1, 0, 20, 0, 21, 0), (0, 22, 0), (0, 23, 0, 2)]


@needs_voice
def test_the_fronts_durations_are_its_frames(tts: object) -> None:
    """The durations the front now gives out add up to the phrase's frames, one per id."""
    split = tts.voice.split  # type: ignore[attr-defined]
    ids, scales = tts.voice.inputs(PHRASE)  # type: ignore[attr-defined]
    phrase = split.front(ids, scales)
    assert phrase.durations.shape == (ids.shape[1],)
    assert int(phrase.durations.sum()) == phrase.num_frames


def _spoken(stage: object, text: str) -> tuple[list[int], list[bytes]]:
    """The text fed a word at a time: how many words were in when each chunk came out,
    and the chunks."""
    from stages.voice.payloads import TextPiece

    stage.open_stream("j", Request())  # type: ignore[attr-defined]
    pieces = [f" {word}" for word in text.split()]
    fed, chunks = [], []
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        output = stage.step([StreamWork("j", (TextPiece(piece),), last)])["j"]  # type: ignore[attr-defined]
        while True:
            for item in output.visible:
                if isinstance(item, AudioChunk):
                    fed.append(index + 1)
                    chunks.append(item.pcm16)
            if not (output.more or (last and not output.done)):
                break
            output = stage.step([StreamWork("j", (), last)])["j"]  # type: ignore[attr-defined]
    stage.close_stream("j")  # type: ignore[attr-defined]
    return fed, chunks


@needs_voice
@pytest.mark.parametrize(
    "text", ["Dogs like to play in the park.", "She reads a book every night."]
)
def test_the_first_part_joins_the_whole_phrase_without_a_word_lost(
    tmp_path: Path, text: str
) -> None:
    """first_part_words: the first words' audio goes out while the phrase is still being
    written (it stops where the part's last word begins, in the part's own alignment),
    and the rest comes from the whole phrase's pass, from where that word begins in its
    alignment: the frames add up to exactly that, and the judge hears every word once."""
    from stages.voice.tts import PiperTts
    from stages.voice.tts_stream import JOIN_FRAMES, word_starts
    from tests.voice_support import transcribe_pcm16, word_error_rate

    stage = PiperTts(
        "tts",
        first_chunk_frames=FIRST_FRAMES,
        first_phrase_max_words=12,
        first_part_words=4,
        noise=False,
        cache_dir=str(tmp_path),
    )
    try:
        fed, chunks = _spoken(stage, text)
        split = stage.voice.split
        assert split is not None
        space = stage.symbols.ids[" "]
        part = " ".join(text.split()[:4])
        starts = []
        for words in (part, text):
            ids, scales = stage.voice.inputs(words, noise=False)
            phrase = split.front(ids, scales)
            starts.append((word_starts(ids[0].tolist(), phrase.durations, space), phrase))
        (part_starts, _), (whole_starts, whole) = starts
        part_frames = part_starts[-1]  # up to where the part's last word begins
        rest_frames = whole.num_frames - whole_starts[len(part_starts) - 1]
        assert fed[0] == 5  # out once the fourth word is known whole, before the text ends
        assert fed[-1] == len(text.split())
        assert stage.joins.num_joins == 1
        assert stage.joins.join_mismatches == 0
        samples = sum(len(c) for c in chunks) // 2
        made = (part_frames + rest_frames) * split.hop  # less the first audio's quiet start
        assert made - int(0.06 * stage.sample_rate_hz) <= samples <= made
        assert part_frames > JOIN_FRAMES
        lead = bytes(2 * int(0.3 * stage.sample_rate_hz))  # as the clean-speech test
        heard = transcribe_pcm16(lead + b"".join(chunks), stage.sample_rate_hz)
        assert word_error_rate(text, heard) == 0.0, heard
    finally:
        stage.close()


@needs_voice
def test_a_first_phrase_late_for_its_join_is_cut_at_its_last_whole_word(tmp_path: Path) -> None:
    """first_phrase_cut_s: once the first part's audio runs out within it (here: at
    once) and the first phrase is still open, it ends at its last whole word and its join
    is made then, not when the sentence ends; the rest is a later phrase, no word lost."""
    from stages.voice.tts import PiperTts
    from tests.voice_support import transcribe_pcm16, word_error_rate

    text = "Dogs like to play in the park."
    stage = PiperTts(
        "tts",
        first_chunk_frames=FIRST_FRAMES,
        first_phrase_max_words=12,
        first_part_words=4,
        first_phrase_cut_s=60.0,
        noise=False,
        cache_dir=str(tmp_path),
    )
    try:
        fed, chunks = _spoken(stage, text)
        assert fed[0] == 5  # the first part, once "play" is known whole
        assert stage.first_phrase_cuts == 1
        assert stage.joins.num_joins == 1
        assert 6 in fed  # the join: "Dogs like to play in", cut once "in" was whole
        lead = bytes(2 * int(0.3 * stage.sample_rate_hz))
        heard = transcribe_pcm16(lead + b"".join(chunks), stage.sample_rate_hz)
        assert word_error_rate(text, heard) == 0.0, heard
    finally:
        stage.close()
    with pytest.raises(ValueError, match="first_phrase_cut_s needs first_part_words"):
        PiperTts("tts", first_chunk_frames=FIRST_FRAMES, first_phrase_cut_s=0.2)


@needs_voice
def test_a_first_phrase_shorter_than_the_part_is_spoken_as_before(tmp_path: Path) -> None:
    from stages.voice.tts import PiperTts

    stage = PiperTts(
        "tts", first_chunk_frames=FIRST_FRAMES, first_part_words=4, cache_dir=str(tmp_path)
    )
    try:
        fed, _chunks = _spoken(stage, "Yes, it is.")
        assert set(fed) == {3}  # spoken whole, when the text ends
        assert stage.joins.num_joins == 0
    finally:
        stage.close()


@needs_voice
def test_a_first_part_without_its_conditions_is_refused() -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match="first_part_words needs first_chunk_frames"):
        PiperTts("tts", first_part_words=4, first_phrase_max_words=8)
    with pytest.raises(ValueError, match="below first_phrase_max_words"):
        PiperTts("tts", first_part_words=8, first_chunk_frames=32, first_phrase_max_words=8)
