"""A long phrase spoken in parts (the TTS param ``max_part_frames``): its parts join
into one pass's audio, a step speaks one part, another answer's first phrase goes out
between two parts, and a phrase at the phoneme cap no longer peaks at ~0.4 GB
(round 3, row 4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnitrio import AudioChunk, Request, StreamOutput, StreamWork
from tests.voice_support import needs_voice

LONG = (
    "The old lighthouse stood on the rocks at the edge of the bay and every night the"
    " keeper climbed the stairs and lit the lamp for the ships passing by."
)  # one phrase of 26 words: ~600 frames
PART_FRAMES = 128


def _stage(tmp_path: Path, **params: object) -> Any:
    """A TTS stage speaking in parts of PART_FRAMES, ``LONG`` one phrase, no noise."""
    from stages.voice.tts import PiperTts

    return PiperTts(
        "tts",
        max_part_frames=PART_FRAMES,
        first_phrase_max_words=40,
        max_phrase_words=40,
        noise=False,
        cache_dir=str(tmp_path),
        **params,  # type: ignore[arg-type]
    )


@pytest.fixture
def tts(tmp_path: Path) -> Iterator[object]:
    stage = _stage(tmp_path)
    yield stage
    stage.close()


def _samples(output: StreamOutput) -> np.ndarray:
    chunks = [item.pcm16 for item in output.visible if isinstance(item, AudioChunk)]
    return np.frombuffer(b"".join(chunks), dtype=np.int16).astype(np.float32) / 32768.0


@needs_voice
def test_part_frames_even_out_the_parts() -> None:
    from stages.voice.tts_stream import part_frames

    assert part_frames(100, None) == 100
    assert part_frames(100, 256) == 100
    assert part_frames(257, 256) == 129  # two parts of 129 and 128, not 256 and 1
    assert part_frames(600, 256) == 200


@needs_voice
def test_a_long_phrase_is_spoken_a_part_a_step_and_joins_into_one_pass(tts: object) -> None:
    from stages.voice.payloads import TextPiece

    whole = tts.synthesize(LONG, noise=False)  # type: ignore[attr-defined]
    hop = tts.voice.split.hop  # type: ignore[attr-defined]
    tts.open_stream("s", Request())  # type: ignore[attr-defined]
    outputs = [tts.step([StreamWork("s", (TextPiece(LONG),), True)])["s"]]  # type: ignore[attr-defined]
    while not outputs[-1].done:
        outputs.append(tts.step([StreamWork("s", (), True)])["s"])  # type: ignore[attr-defined]
    tts.close_stream("s")  # type: ignore[attr-defined]
    parts = [_samples(out) for out in outputs]
    assert len(parts) >= -(-whole.size // (PART_FRAMES * hop)) >= 4
    assert max(part.size for part in parts) <= PART_FRAMES * hop
    assert all(out.more for out in outputs[:-1])
    joined = np.concatenate(parts)  # its first audio starts at its first sound (quiet cut)
    np.testing.assert_allclose(joined, whole[whole.size - joined.size :], atol=5e-3)


@needs_voice
def test_another_answers_first_phrase_goes_out_between_two_parts(tts: object) -> None:
    from stages.voice.payloads import TextPiece

    tts.open_stream("long", Request())  # type: ignore[attr-defined]
    first = tts.step([StreamWork("long", (TextPiece(LONG),), True)])["long"]  # type: ignore[attr-defined]
    assert first.more
    assert tts.streams["long"].going_on is not None  # type: ignore[attr-defined]
    tts.open_stream("new", Request())  # type: ignore[attr-defined]
    step = tts.step(  # type: ignore[attr-defined]
        [StreamWork("long", (), True), StreamWork("new", (TextPiece("Yes."),), True)]
    )
    assert _samples(step["new"]).size > 0
    assert _samples(step["long"]).size == 0
    assert step["long"].more
    assert not step["long"].done
    after = tts.step([StreamWork("long", (), True), StreamWork("new", (), True)])  # type: ignore[attr-defined]
    assert _samples(after["long"]).size > 0
    for sid in ("long", "new"):
        tts.close_stream(sid)  # type: ignore[attr-defined]


@needs_voice
def test_a_first_part_then_parts_of_the_rest(tmp_path: Path) -> None:
    """With ``first_chunk_frames`` the first phrase's rest is spoken in parts too: the
    first with the first chunk's priority, the others as later work."""
    from stages.voice.payloads import TextPiece

    tts = _stage(tmp_path, first_chunk_frames=24)
    try:
        whole = tts.synthesize(LONG, noise=False)
        hop = tts.voice.split.hop
        tts.open_stream("s", Request())
        outputs = [tts.step([StreamWork("s", (TextPiece(LONG),), True)])["s"]]
        assert tts.streams["s"].rest is not None
        outputs.append(tts.step([StreamWork("s", (), True)])["s"])
        assert tts.streams["s"].rest is None
        assert tts.streams["s"].going_on is not None  # the rest's further parts: later work
        while not outputs[-1].done:
            outputs.append(tts.step([StreamWork("s", (), True)])["s"])
        tts.close_stream("s")
        parts = [_samples(out) for out in outputs]
        assert max(part.size for part in parts[1:]) <= PART_FRAMES * hop
        joined = np.concatenate(parts)
        np.testing.assert_allclose(joined, whole[whole.size - joined.size :], atol=5e-3)
    finally:
        tts.close()


@needs_voice
def test_too_small_parts_are_refused() -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match="max_part_frames must be at least 32 or null, got 8"):
        PiperTts("tts", max_part_frames=8)


def _peak_growth_mb(max_part_frames: int | None, tmp_path: Path) -> float:
    """What two phrases at the phoneme cap add to the process's peak RSS, spoken as the
    stage speaks them (Linux: the peak is reset through /proc/self/clear_refs)."""
    from stages.voice.payloads import TextPiece
    from stages.voice.tts import PiperTts

    tts = PiperTts("tts", max_part_frames=max_part_frames, cache_dir=str(tmp_path))
    try:
        tts.synthesize("Good morning to you.", noise=False)
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_mb("VmRSS")
        tts.open_stream("s", Request())
        output = tts.step([StreamWork("s", (TextPiece("W. " * 24),), True)])["s"]
        while not output.done:
            output = tts.step([StreamWork("s", (), True)])["s"]
        tts.close_stream("s")
        return _status_mb("VmHWM") - before
    finally:
        tts.close()


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


@needs_voice
def test_a_phrase_at_the_phoneme_cap_peaks_low_in_parts(tmp_path: Path) -> None:
    """Round 3, row 4: "W. " x 24 is a phrase at the 600-id cap, ~1,650 frames (~19 s);
    in one pass it peaked at +419-443 MB, in parts of 128 frames (the voice chat's)
    +20-30 MB, of 256 +46-75 MB."""
    in_parts = _peak_growth_mb(128, tmp_path)
    assert in_parts < 200
