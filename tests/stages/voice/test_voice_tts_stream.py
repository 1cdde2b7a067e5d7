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
