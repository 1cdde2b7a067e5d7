"""An answer's first phrase spoken in parts (first_chunk_frames): the first part goes
out a step before the rest, and the parts join into the one-pass audio."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omnitrio import AudioChunk, Request, StreamWork
from tests.voice_support import needs_voice

pytestmark = needs_voice

PHRASE = "Cats like to eat fish and chicken."
FIRST_FRAMES = 24


@pytest.fixture
def tts(tmp_path: Path) -> Iterator[object]:
    from stages.voice.tts import PiperTts

    stage = PiperTts("tts", first_chunk_frames=FIRST_FRAMES, cache_dir=str(tmp_path))
    yield stage
    stage.close()


def test_the_parts_join_into_the_one_pass_audio(tts: object) -> None:
    from stages.voice.tts import PiperTts

    assert isinstance(tts, PiperTts)
    assert tts._split is not None
    whole = tts.synthesize(PHRASE, noise=False)  # the voice's own graph, no sampled noise
    phrase = tts._split.front(*tts._inputs(PHRASE, noise=False))
    first = tts._split.speak(phrase, FIRST_FRAMES)
    rest = tts._split.speak(phrase, phrase.num_frames)
    assert first.size == FIRST_FRAMES * tts._split.hop
    joined = np.concatenate([first, rest])
    assert joined.size == whole.size
    np.testing.assert_allclose(joined, whole, atol=2e-3)


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
    assert len(chunks[0].pcm16) == 2 * FIRST_FRAMES * tts._split.hop  # type: ignore[attr-defined]
    assert outputs[0].more
    assert len(chunks[1].pcm16) > len(chunks[0].pcm16)


def test_a_first_phrase_too_short_to_gain_from_parts_is_spoken_whole(tts: object) -> None:
    """A part computes right_frames past its end: a first phrase no longer than the
    first part and that is made in one pass, not twice."""
    from stages.voice.payloads import TextPiece

    tts.open_stream("s", Request())  # type: ignore[attr-defined]
    text = (TextPiece("Yes."), TextPiece(" Dogs like bones too."))
    outputs = [tts.step([StreamWork("s", text, True)])["s"]]  # type: ignore[attr-defined]
    while not outputs[-1].done:
        outputs.append(tts.step([StreamWork("s", (), True)])["s"])  # type: ignore[attr-defined]
    tts.close_stream("s")  # type: ignore[attr-defined]
    chunks = [item for out in outputs for item in out.visible if isinstance(item, AudioChunk)]
    assert len(chunks) == 2  # each phrase whole
    split = tts._split  # type: ignore[attr-defined]
    assert len(chunks[0].pcm16) > 2 * FIRST_FRAMES * split.hop
    assert len(chunks[0].pcm16) <= 2 * (FIRST_FRAMES + split.right_frames) * split.hop


def test_a_non_positive_first_chunk_is_refused() -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match="first_chunk_frames must be positive or null, got 0"):
        PiperTts("tts", first_chunk_frames=0)


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


def test_a_first_phrase_is_spoken_before_another_answers_later_phrase(tts: object) -> None:
    """A step that speaks one answer's first phrase (both its parts) defers another's
    later phrase to a later step, so the first audio is not held behind it."""
    from stages.voice.payloads import TextPiece

    def audio(output: object) -> int:
        return sum(isinstance(i, AudioChunk) for i in output.visible)  # type: ignore[attr-defined]

    for sid in ("old", "new"):
        tts.open_stream(sid, Request())  # type: ignore[attr-defined]
    second = (TextPiece(PHRASE), TextPiece(" Dogs like bones too."))
    for inputs in (second, ()):  # the old answer's first phrase, in its two parts
        assert audio(tts.step([StreamWork("old", inputs, True)])["old"])  # type: ignore[attr-defined]
    steps = [
        tts.step([StreamWork("old", (), True), StreamWork("new", inputs, True)])  # type: ignore[attr-defined]
        for inputs in ((TextPiece(PHRASE),), (), ())
    ]
    assert [audio(s["new"]) for s in steps] == [1, 1, 0]  # its first phrase's two parts
    assert [audio(s["old"]) for s in steps] == [0, 0, 1]  # then its second phrase
    assert steps[0]["old"].more
    assert not steps[0]["old"].done
    assert steps[2]["old"].done
    for sid in ("old", "new"):
        tts.close_stream(sid)  # type: ignore[attr-defined]
