"""The TTS's synthesis step (tts_synthesis.py): each way of making an answer's next
audio moves its phrase queue on as the stage's step expects, and counts the audio."""

from __future__ import annotations

from pathlib import Path

from stages.voice.payloads import TextPiece
from stages.voice.phrases import PhraseSplitter
from stages.voice.tts_schedule import PhraseQueue
from tests.voice_support import needs_voice

PHRASE = "Cats like to eat fish and chicken."


@needs_voice
def test_a_first_phrase_in_two_parts_then_a_later_phrase_whole(tmp_path: Path) -> None:
    from stages.voice.tts_synthesis import PiperVoice, SplitParams, voice_files

    onnx, config = voice_files(None, None)
    voice = PiperVoice(
        onnx,
        config,
        SplitParams(first_chunk_frames=24),
        str(tmp_path),
        espeak_timeout_s=5.0,
        max_phoneme_ids=600,
        num_threads=1,
        noise=False,
        keep_words_apart=True,
    )
    try:
        assert voice.split is not None
        queue = PhraseQueue(splitter=PhraseSplitter())
        queue.feed((TextPiece(f"{PHRASE} Dogs like bones."),), True)
        first = voice.timed(voice.first_part, queue)
        assert first.size == 24 * voice.split.hop
        assert queue.rest is not None  # its rest is the next step's
        assert queue.spoken == 1
        rest = voice.timed(voice.rest, queue)
        assert queue.rest is None
        assert voice.audio_s == (first.size + rest.size) / voice.sample_rate_hz
        later = voice.whole(queue)
        assert later.size > 0
        assert queue.spoken == 2
        assert not queue.phrases
        assert voice.busy_s > 0
    finally:
        voice.close()
