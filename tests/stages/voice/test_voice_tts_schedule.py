"""Which answer speaks what in a TTS step (tts_schedule.py): a first phrase due holds
every later phrase back a step; else one later phrase, the answer's whose audio runs
out first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnitrio import AudioChunk, Request, StreamWork
from stages.voice.payloads import TextPiece
from stages.voice.phrases import PhraseSplitter
from stages.voice.tts_schedule import PhraseQueue, later_phrase
from tests.voice_support import needs_voice

PHRASE = "Cats like to eat fish and chicken."


def _queue(
    text: str, *, closed: bool = True, spoken: int = 0, runs_out: float = 0.0
) -> PhraseQueue:
    queue = PhraseQueue(splitter=PhraseSplitter(), spoken=spoken, runs_out=runs_out)
    queue.feed((TextPiece(text),), closed)
    return queue


def test_a_queue_holds_each_phrase_once_complete_and_the_rest_at_the_end() -> None:
    queue = _queue("Yes. And then some", closed=False)
    assert list(queue.phrases) == ["Yes."]
    assert queue.first_due()
    assert not queue.later_due()
    queue.feed((), True)
    assert list(queue.phrases) == ["Yes.", "And then some"]
    assert queue.pop() == "Yes."
    assert queue.text_ready > 0  # when it was complete, for the trace


def test_a_phrase_keeps_when_its_text_left_the_llm_or_when_it_was_cut_for_time() -> None:
    """For the trace (voice_late_parts.py's delivery): a phrase completed by a piece is
    written when that piece left the LLM; one the TTS cut for time is complete only then,
    and the rest at the text's end when its last piece left."""
    queue = PhraseQueue(splitter=PhraseSplitter(first_max_words=3), spoken=1)
    queue.feed((TextPiece("A good name for a small", written_s=2.0),), False)
    assert (queue.pop(), queue.text_written) == ("A good name", 2.0)
    queue.feed((TextPiece(" dog could", written_s=3.0),), False)
    queue.runs_out = time.monotonic() + 0.1
    before = time.monotonic()
    assert queue.cut_later_if_late(0.4)
    assert queue.pop() == "for a small dog"
    assert queue.text_written >= before  # cut for time: written when it was cut
    queue.feed((TextPiece(" be Max", written_s=4.0),), True)
    assert (queue.pop(), queue.text_written) == ("could be Max", 4.0)


def test_a_first_phrase_due_holds_every_later_phrase_back() -> None:
    queues = {"old": _queue("Yes. No.", spoken=1, runs_out=5.0), "new": _queue("Hello.")}
    assert queues["old"].later_due()
    assert queues["new"].first_due()
    assert later_phrase(queues, ["old", "new"]) == (None, False)
    assert later_phrase(queues, ["old"]) == ("old", False)


def test_one_later_phrase_a_step_the_one_whose_audio_runs_out_first() -> None:
    queues = {
        sid: _queue("Yes. No.", spoken=1, runs_out=runs_out)
        for sid, runs_out in (("a", 3.0), ("b", 1.0), ("c", 2.0))
    }
    assert later_phrase(queues, ["a", "b", "c"]) == ("b", False)
    queues["b"].phrases.clear()  # nothing ready: not chosen
    assert later_phrase(queues, ["a", "b", "c"]) == ("c", False)
    assert later_phrase(queues, []) == (None, False)


def test_a_later_phrase_that_may_wait_is_held_back_and_the_next_one_speaks() -> None:
    """``later_phrase_min_slack_s``: the answers ``may_wait`` names are skipped (and the
    step says it held one back); none left, none speaks."""
    queues = {
        sid: _queue("Yes. No.", spoken=1, runs_out=runs_out)
        for sid, runs_out in (("a", 3.0), ("b", 1.0))
    }
    assert later_phrase(queues, ["a", "b"], lambda sid: sid == "b") == ("a", True)
    assert later_phrase(queues, ["a", "b"], lambda sid: True) == (None, True)
    assert later_phrase(queues, ["a", "b"], lambda sid: False) == ("b", False)


def test_no_cut_without_a_first_part_out() -> None:
    queue = _queue("Dogs like to play in", closed=False)
    assert queue.join is None
    assert not queue.cut_if_late(60.0)
    assert not queue.phrases


def test_a_later_phrase_is_cut_only_once_the_answers_audio_runs_out_within_the_limit() -> None:
    queue = PhraseQueue(splitter=PhraseSplitter(first_max_words=3), spoken=1)
    queue.feed((TextPiece("A good name for a small dog could be "),), False)
    assert queue.pop() == "A good name"
    assert not queue.cut_later_if_late(0.4)  # no audio made yet: nothing runs out
    queue.runs_out = time.monotonic() + 1.0
    assert not queue.cut_later_if_late(0.4)  # a second of audio ahead
    assert not queue.cut_later_if_late(None)  # off
    queue.runs_out = time.monotonic() + 0.3
    assert queue.cut_later_if_late(0.4)
    assert list(queue.phrases) == ["for a small dog could be"]
    assert not queue.cut_later_if_late(0.4)  # one is queued: no cut


@pytest.fixture
def tts(tmp_path: Path) -> Iterator[object]:
    from stages.voice.tts import PiperTts

    stage = PiperTts("tts", first_chunk_frames=24, cache_dir=str(tmp_path))
    yield stage
    stage.close()


@needs_voice
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


@needs_voice
def test_a_step_speaks_one_later_phrase_the_one_that_runs_out_first(tts: object) -> None:
    """With no first phrase due, a step speaks one later phrase: that of the answer whose
    audio, played from its first audio on, runs out first (the others wait a step, so an
    answer's first phrase arriving meanwhile waits behind one later phrase at most)."""
    from stages.voice.payloads import TextPiece

    texts = {"long": PHRASE, "yes": "Yes.", "no": "No."}  # each first phrase, then one more
    for sid, first in texts.items():  # one after another: "long" runs out last
        tts.open_stream(sid, Request())  # type: ignore[attr-defined]
        inputs: tuple[object, ...] = (TextPiece(f"{first} Birds like seeds and crumbs."),)
        while tts.streams[sid].first_due() or inputs:  # type: ignore[attr-defined]
            tts.step([StreamWork(sid, inputs, True)])  # type: ignore[attr-defined]
            inputs = ()
    runs_out = {sid: tts.streams[sid].runs_out for sid in texts}  # type: ignore[attr-defined]
    assert max(runs_out, key=runs_out.__getitem__) == "long"
    spoken = []
    for _ in texts:
        outputs = tts.step([StreamWork(sid, (), True) for sid in texts])  # type: ignore[attr-defined]
        speaking = [sid for sid, out in outputs.items() if out.visible]
        assert len(speaking) == 1, outputs
        assert all(out.more for sid, out in outputs.items() if sid not in speaking + spoken)
        spoken += speaking
    assert spoken == sorted(texts, key=runs_out.__getitem__)
    for sid in texts:
        tts.close_stream(sid)  # type: ignore[attr-defined]


@needs_voice
def test_a_negative_later_phrase_cut_is_refused() -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match="later_phrase_cut_s must be at least 0 or null"):
        PiperTts("tts", later_phrase_cut_s=-0.1)


@needs_voice
@pytest.mark.parametrize("words", [1, 9])
def test_a_first_phrase_boundary_minimum_outside_its_bounds_is_refused(words: int) -> None:
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match=f"first_phrase_boundary_min_words .*got {words}"):
        PiperTts("tts", first_phrase_max_words=8, first_phrase_boundary_min_words=words)


@needs_voice
def test_each_step_is_logged_for_the_trace_with_the_answers_it_made_audio_for(
    tts: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With tracing on (``--trace``), each TTS step is a ``voice-step`` line: the stage,
    its start and end (monotonic s), its batch size and the answers it made audio for
    ("-": none), so a late part's wait can be laid against the steps around it; then
    the CPU time its thread spent on it and the thread's id."""
    from stages.voice import trace

    monkeypatch.setattr(trace, "ENABLED", True)
    caplog.set_level("INFO", logger="stages.voice.trace")
    for sid in ("speaks", "waits"):
        tts.open_stream(sid, Request())  # type: ignore[attr-defined]
    before = time.monotonic()
    tts.step([StreamWork("speaks", (TextPiece(PHRASE),), True), StreamWork("waits", (), False)])  # type: ignore[attr-defined]
    tts.step([StreamWork("waits", (TextPiece("Dogs"),), False)])  # type: ignore[attr-defined]
    lines = [r.getMessage().split() for r in caplog.records if "voice-step" in r.getMessage()]
    assert [(line[1], line[4], line[5]) for line in lines] == [
        ("tts", "2", "speaks"),
        ("tts", "1", "-"),
    ]
    assert before <= float(lines[0][2]) <= float(lines[0][3]) <= float(lines[1][2])
    # the CPU time its thread spent on the step (the phrase's synthesis: more than none,
    # no more than the step's length) and the thread's id, to tell waiting for a core
    # from slower work
    spoke_s = float(lines[0][3]) - float(lines[0][2])
    assert 0.0 < float(lines[0][6]) <= spoke_s + 0.01
    assert [line[7] for line in lines] == [str(threading.get_native_id())] * 2
    for sid in ("speaks", "waits"):
        tts.close_stream(sid)  # type: ignore[attr-defined]
