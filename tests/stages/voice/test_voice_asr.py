"""The ASR stage transcribes a long utterance in chunks (stages/voice/asr.py): each cut
where the speech is quiet, the transcript whole at the end, and a short request served
between another's chunks instead of behind its whole audio (issue 42, attack 7)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import trio

import omnitrio
from omnitrio import AudioInput, Event, Request, StreamWork
from tests.voice_support import INPUT_RATE_HZ, needs_voice, spoken, word_error_rate

if TYPE_CHECKING:
    from stages.voice.asr import _AsrStage

STORY = (
    "The old lighthouse stood on the rocks at the edge of the bay. "
    "Every night the keeper climbed the stairs and lit the lamp. "
    "Ships passing in the dark saw the light and turned away from the reef. "
    "One winter a great storm came from the north. "
    "The waves were taller than the houses in the village. "
    "The keeper stayed at his post for three days without sleep. "
    "On the fourth morning the sea was calm again."
)
QUESTION = "What do cats like to eat?"


def test_a_chunk_ends_at_the_quietest_point_near_its_limit() -> None:
    from stages.voice.asr import next_cut

    samples = np.ones(1500, np.float32)
    samples[870:890] = 0.0  # a pause inside the last 200 samples of the first 1,000
    samples[500:520] = 0.0  # one before them is not looked at
    assert next_cut(samples, 0, 1000, 200, 20) == 870 + 10
    # what is left fits: the chunk is the rest
    assert next_cut(samples, 880, 1000, 200, 20) == 1500
    # no quiet anywhere: some cut in the searched span, never past the limit
    assert 800 <= next_cut(np.ones(5000, np.float32), 0, 1000, 200, 20) <= 1000
    # a search span no longer than the window cuts at the limit
    assert next_cut(np.ones(5000, np.float32), 0, 1000, 20, 20) == 1000


def test_max_chunk_s_below_a_second_or_a_bad_max_step_s_is_refused_naming_it() -> None:
    from stages.voice.asr import _AsrStage

    with pytest.raises(ValueError, match="max_chunk_s"):
        _AsrStage("asr", max_chunk_s=0.5)
    for bad in (-0.01, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="max_step_s"):
            _AsrStage("asr", max_step_s=bad)


def _story_pcm16(tmp_path: Path) -> bytes:
    """The story read sentence by sentence (Piper), ~24 s at 24 kHz."""
    sentences = re.split(r"(?<=\.) ", STORY)
    return b"".join(
        spoken(s, tmp_path / f"story{n}.wav", silence_after_s=0.15) for n, s in enumerate(sentences)
    )


@needs_voice
def test_a_long_utterance_is_heard_chunk_by_chunk_and_whole(tmp_path: Path) -> None:
    from stages.voice.asr import MoonshineAsr

    stage = MoonshineAsr("asr", num_threads=2, decoder_num_threads=1)
    pcm16 = _story_pcm16(tmp_path)
    seconds = len(pcm16) / 2 / INPUT_RATE_HZ
    assert seconds > 20
    stage.open_stream("s", Request(audio=AudioInput(pcm16, INPUT_RATE_HZ)))
    steps = 0
    while True:
        steps += 1
        output = stage.step([StreamWork("s", (), True)])["s"]
        if output.done:
            break
        assert output.more
        assert not output.payloads
        assert not output.visible
    stage.close_stream("s")
    assert steps >= 5  # 5 s at most a step
    (event,) = output.visible
    assert isinstance(event, Event)
    heard = str(event.data["text"])
    assert word_error_rate(STORY, heard) < 0.1, heard
    stage.close()


def _steps_until_done(stage: _AsrStage, stream_ids: list[str]) -> tuple[dict[str, str], int]:
    """Step the streams in turn, one a step, until each is done: transcripts, steps."""
    heard: dict[str, str] = {}
    steps = 0
    while len(heard) < len(stream_ids):
        for stream_id in stream_ids:
            if stream_id in heard:
                continue
            steps += 1
            output = stage.step([StreamWork(stream_id, (), True)])[stream_id]
            if output.done:
                (event,) = output.visible
                heard[stream_id] = str(event.data["text"])
            else:
                assert output.more
                assert not output.payloads
                assert not output.visible
    return heard, steps


@needs_voice
def test_a_long_utterance_is_heard_in_slices_that_give_the_same_words(tmp_path: Path) -> None:
    """With ``max_step_s`` 0 every piece of work (a chunk's encoder pass, a token) is a
    step of its own: two long utterances stepped in turn, slice by slice, give the
    words they give a chunk a step; a one-chunk utterance is still one step."""
    from stages.voice.asr import MoonshineAsr

    stage = MoonshineAsr("asr", num_threads=2, decoder_num_threads=1, max_step_s=10.0)
    story = _story_pcm16(tmp_path)
    question = spoken(QUESTION, tmp_path / "q.wav", silence_after_s=0.3)
    stage.open_stream("whole", Request(audio=AudioInput(story, INPUT_RATE_HZ)))
    whole, chunk_steps = _steps_until_done(stage, ["whole"])
    stage.close_stream("whole")
    stage.max_step_s = 0.0
    for name in ("a", "b"):
        stage.open_stream(name, Request(audio=AudioInput(story, INPUT_RATE_HZ)))
    stage.open_stream("short", Request(audio=AudioInput(question, INPUT_RATE_HZ)))
    sliced, slice_steps = _steps_until_done(stage, ["a", "b"])
    assert sliced == {"a": whole["whole"], "b": whole["whole"]}
    assert slice_steps > 2 * 5 * chunk_steps  # an encoder pass and tokens, a step each
    short, short_steps = _steps_until_done(stage, ["short"])
    assert short_steps == 1
    assert word_error_rate(QUESTION, short["short"]) == 0.0, short
    stage.close()


def _asr_config() -> omnitrio.PipelineConfig:
    return omnitrio.parse_config(
        {
            "pipeline": {"name": "asr", "max_streams": 8},
            "stages": [
                {
                    "name": "asr",
                    "impl": "stages.voice.asr:MoonshineAsr",
                    "max_batch_size": 1,
                    "params": {"num_threads": 2, "decoder_num_threads": 1},
                }
            ],
        }
    )


@needs_voice
async def test_a_short_transcription_is_not_behind_four_long_ones(tmp_path: Path) -> None:
    """Four ~24 s transcriptions start together, then a 2 s one: the short one's
    transcript comes before any long one's (it waits for chunks, not whole utterances),
    and every transcript is right."""
    story = _story_pcm16(tmp_path)
    question = spoken(QUESTION, tmp_path / "q.wav", silence_after_s=0.3)
    finished: list[str] = []
    heard: dict[str, str] = {}

    async def transcribe(pipeline: omnitrio.Pipeline, name: str, pcm16: bytes) -> None:
        request = Request(audio=AudioInput(pcm16, INPUT_RATE_HZ), options={"task": "transcribe"})
        async with pipeline.open_stream(request) as stream:
            async for item in stream:
                if isinstance(item, Event) and item.name == "transcript":
                    heard[name] = str(item.data["text"])
        finished.append(name)

    async with omnitrio.open_pipeline(_asr_config()) as pipeline:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for n in range(4):
                    nursery.start_soon(transcribe, pipeline, f"long{n}", story)
                await trio.sleep(0.05)  # the long ones are in first
                nursery.start_soon(transcribe, pipeline, "short", question)
    assert finished[0] == "short", finished
    assert word_error_rate(QUESTION, heard["short"]) == 0.0, heard["short"]
    for n in range(4):
        assert word_error_rate(STORY, heard[f"long{n}"]) < 0.1, heard[f"long{n}"]


def test_an_utterance_closed_before_its_text_went_on_no_longer_counts_as_starting() -> None:
    """An answer counts as starting from its ASR's last chunk (first_audio.py), and the LLM
    and the TTS clear that; a turn cancelled before the LLM had its text is the ASR's to
    clear, or it would hold the answers already speaking until the age cap."""
    from stages.voice.asr import ASR_RATE_HZ, _AsrStage
    from stages.voice.first_audio import FIRST_AUDIO

    class _Sliced(_AsrStage):
        def _text(self, samples: np.ndarray) -> str:
            return "hi"

        def _pieces(self, samples: np.ndarray):  # type: ignore[no-untyped-def]
            yield  # a piece of work, then the text: a step may stop between the two
            return self._text(samples)

    stage = _Sliced("asr", max_chunk_s=1.0, max_step_s=0.0)
    pcm16 = (np.sin(np.arange(int(1.5 * ASR_RATE_HZ)) / 5) * 8000).astype("<i2").tobytes()
    for stream_id in ("cancelled", "heard"):
        stage.open_stream(stream_id, Request(audio=AudioInput(pcm16, ASR_RATE_HZ)))
    for _ in range(3):  # the first chunk's two steps, then the last chunk's first piece
        assert stage.step([StreamWork("cancelled", (), True)])["cancelled"].more
    assert "cancelled" in FIRST_AUDIO._starting  # its last chunk began
    stage.close_stream("cancelled")
    assert "cancelled" not in FIRST_AUDIO._starting
    _steps_until_done(stage, ["heard"])
    stage.close_stream("heard")  # its Utterance went on: the LLM's and the TTS's to clear
    assert "heard" in FIRST_AUDIO._starting
    FIRST_AUDIO.forget("heard")
    stage.close()
