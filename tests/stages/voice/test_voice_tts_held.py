"""A TTS step whose only work is later phrases held back for another answer's start
(``later_phrase_min_slack_s``) waits on the events that matter, not on a timer: text
the LLM hands on, the start's end, or a held phrase's own audio running down to the
slack (first_audio.py ``wait_held``, tts.py); and the params in seconds are checked
by a config's check."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnitrio import AudioChunk, Request, StreamWork
from stages.voice.first_audio import FirstAudio
from stages.voice.payloads import TextPiece
from tests.voice_support import needs_voice

PHRASE = "Cats like to eat fish and chicken."


def _later(delay_s: float, act: object) -> threading.Timer:
    timer = threading.Timer(delay_s, act)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_a_held_wait_ends_when_text_is_handed_on_and_not_once_the_tts_has_it() -> None:
    """Text the LLM hands on ends the wait at once (the TTS's next step takes it);
    text the TTS already had does not, nor does text handed on long ago and never fed
    (a dropped stream); else the wait lasts until its time."""
    gate = FirstAudio()
    gate.held_wait_max_s = 5.0  # the events, not the cap, are tested
    gate.answer_starting("new")
    piece = TextPiece("Hello")
    started = time.monotonic()
    timer = _later(0.05, lambda: gate.handed("new", (piece,), False))
    assert gate.wait_held(started + 1.0, 0.5)
    assert 0.045 <= time.monotonic() - started < 0.5
    timer.join()
    assert gate.wait_held(time.monotonic() + 1.0, 0.5)  # still on its way: at once
    gate.fed("new", (piece,), False)
    started = time.monotonic()
    assert not gate.wait_held(started + 0.06, 0.5)  # nothing on its way: until its time
    assert time.monotonic() - started >= 0.055
    gate.handed("gone", (TextPiece("Bye"),), True)
    time.sleep(0.11)  # TRANSIT_MAX_S: not coming
    started = time.monotonic()
    assert not gate.wait_held(started + 0.03, 0.5)
    assert time.monotonic() - started >= 0.025


def test_a_held_answers_own_text_does_not_end_the_wait() -> None:
    """Text for an answer that would wait itself (its first phrase out, more audio
    ahead than the slack) wakes nobody: its phrase waits anyway, and a wake per token
    would be an empty round each; once its audio ahead is down to the slack, it does."""
    gate = FirstAudio()
    gate.answer_starting("new")
    gate.first_phrase_out("playing")
    gate.audio_made("playing", time.monotonic() + 3.0)
    gate.handed("playing", (TextPiece("Dogs"),), False)
    started = time.monotonic()
    assert not gate.wait_held(started + 0.05, 0.5)
    assert time.monotonic() - started >= 0.045
    assert gate.wait_held(time.monotonic() + 1.0, 3.0)  # at most 3 s ahead: it would go


def test_a_held_wait_ends_when_the_starts_end() -> None:
    """The start held for ends (its first phrase whole, or forgotten): the wait ends
    then; with no start at all it does not wait."""
    gate = FirstAudio()
    gate.held_wait_max_s = 5.0  # the events, not the cap, are tested
    gate.through_first_phrase = gate.hold_for_starting = True
    started = time.monotonic()
    assert not gate.wait_held(started + 1.0, 0.5)
    assert time.monotonic() - started < 0.2
    gate.answer_starting("new")
    started = time.monotonic()
    timer = _later(0.05, lambda: gate.first_phrase_made("new"))
    assert not gate.wait_held(started + 1.0, 0.5)
    assert 0.045 <= time.monotonic() - started < 0.5
    timer.join()


def test_text_for_a_playing_answer_not_in_the_batch_ends_the_wait_once_it_runs_low() -> None:
    """Text handed on for an answer past its first phrase and not yet at the TTS ends
    the wait once that answer's audio ahead is down to the slack, however long ago it
    was handed (its phrase must not sit while it runs dry), and the wait wakes then."""
    gate = FirstAudio()
    gate.held_wait_max_s = 5.0  # the events, not the cap, are tested
    gate.answer_starting("new")
    gate.first_phrase_out("low")
    gate.audio_made("low", time.monotonic() + 0.5 + 0.1)
    last = (TextPiece("Its last words."),)
    gate.handed("low", last, True)
    time.sleep(0.12)  # longer ago than TRANSIT_MAX_S; 0.48 s ahead now
    started = time.monotonic()
    assert gate.wait_held(started + 1.0, 0.5)
    assert time.monotonic() - started < 0.5
    gate.fed("low", last, True)  # the TTS has it: no longer on its way
    gate.first_phrase_out("later")
    gate.audio_made("later", time.monotonic() + 0.5 + 0.15)
    gate.handed("later", (TextPiece("More"),), False)
    started = time.monotonic()
    assert gate.wait_held(started + 1.0, 0.5)  # woken when "later" is down to the slack
    assert 0.1 <= time.monotonic() - started < 0.6


def test_a_held_wait_lasts_at_most_its_cap() -> None:
    """One wait lasts at most ``held_wait_max_s`` (0.1 s) and returns with the phrase
    still held, so the runtime's round (its closes: a cancelled start forgotten) runs
    between; the old wait lasted until the start ended (1.5 s)."""
    gate = FirstAudio()
    gate.answer_starting("new")
    started = time.monotonic()
    assert gate.wait_held(started + 2.0, 0.5)
    assert 0.09 <= time.monotonic() - started < 0.6


def test_text_handed_on_long_ago_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer handed nothing for ``HANDED_KEEP_S`` is forgotten at the next text
    handed on (its TTS closed first, never opened, or none in the process)."""
    from stages.voice import first_audio

    monkeypatch.setattr(first_audio, "HANDED_KEEP_S", 0.05, raising=False)
    gate = FirstAudio()
    gate.handed("gone", (TextPiece("Bye"),), True)
    time.sleep(0.07)
    gate.handed("live", (TextPiece("Hi"),), False)
    assert set(gate._handed) == set(gate._handed_at) == {"live"}


@pytest.fixture
def playing(tmp_path: Path) -> Iterator[object]:
    """A TTS whose answer "old" has spoken its first phrase, a later one queued, while
    "new" is starting (the process's gate, as the stages share it)."""
    from stages.voice.first_audio import FIRST_AUDIO
    from stages.voice.tts import PiperTts

    tts = PiperTts(
        "tts", first_chunk_frames=24, later_phrase_min_slack_s=0.5, cache_dir=str(tmp_path)
    )
    tts.open_stream("old", Request())
    inputs: tuple[object, ...] = (TextPiece(f"{PHRASE} Dogs like bones too."),)
    while tts.streams["old"].first_due() or inputs:
        tts.step([StreamWork("old", inputs, True)])
        inputs = ()
    FIRST_AUDIO.answer_starting("new")
    try:
        yield tts
    finally:
        FIRST_AUDIO.forget("new")
        tts.close_stream("old")  # no state left in the process's gate for later tests
        tts.close()


def _runs_out_in(tts: object, seconds: float) -> None:
    from stages.voice.first_audio import FIRST_AUDIO

    runs_out = time.monotonic() + seconds
    tts.streams["old"].runs_out = runs_out  # type: ignore[attr-defined]
    FIRST_AUDIO.audio_made("old", runs_out)


@needs_voice
def test_a_held_phrase_goes_once_its_own_audio_ahead_is_down_to_the_slack(
    playing: object,
) -> None:
    """Never starved: while the other answer is still starting, the held phrase is
    spoken once its answer's audio ahead is down to the slack (0.5 s), in the step
    that waits then; a step waits at most 0.1 s and returns with more to do (the
    runtime's round runs between), so the first step says more and speaks nothing."""
    _runs_out_in(playing, 0.5 + 0.25)
    started = time.monotonic()
    outs = [playing.step([StreamWork("old", (), True)])["old"]]  # type: ignore[attr-defined]
    assert (outs[0].visible, outs[0].more) == ((), True)
    while not outs[-1].visible and len(outs) < 20:
        outs.append(playing.step([StreamWork("old", (), True)])["old"])  # type: ignore[attr-defined]
    waited = time.monotonic() - started
    assert [isinstance(item, AudioChunk) for item in outs[-1].visible] == [True]
    assert waited >= 0.24


@needs_voice
def test_a_held_step_returns_as_the_new_answers_text_is_handed_on(
    playing: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TTS does not sleep while the starting answer's text is on its way: the
    held step returns when the LLM hands it on, the phrase still held."""
    from stages.voice.first_audio import FIRST_AUDIO

    monkeypatch.setattr(FIRST_AUDIO, "held_wait_max_s", 5.0)  # the event, not the cap
    _runs_out_in(playing, 3.0)
    piece = TextPiece("Hello")
    started = time.monotonic()
    timer = _later(0.1, lambda: FIRST_AUDIO.handed("new", (piece,), False))
    out = playing.step([StreamWork("old", (), True)])["old"]  # type: ignore[attr-defined]
    waited = time.monotonic() - started
    timer.join()
    assert (out.visible, out.more) == ((), True)
    assert 0.095 <= waited < 0.6
    # the TTS has the text; the start ends while the next step waits: the held phrase
    # goes in that same step
    FIRST_AUDIO.fed("new", (piece,), False)
    started = time.monotonic()
    timer = _later(0.05, lambda: FIRST_AUDIO.forget("new"))
    out = playing.step([StreamWork("old", (), True)])["old"]  # type: ignore[attr-defined]
    waited = time.monotonic() - started
    timer.join()
    assert [isinstance(item, AudioChunk) for item in out.visible] == [True]
    assert waited >= 0.045


@pytest.mark.parametrize(
    ("param", "value", "problem"),
    [
        ("later_phrase_min_slack_s", -0.1, "at least 0"),
        ("later_phrase_min_slack_s", "0.75s", "a number of seconds"),
        ("later_phrase_min_slack_s", True, "a number of seconds"),
        ("later_phrase_cut_s", "soon", "a number of seconds"),
    ],
)
def test_a_param_in_seconds_that_is_negative_or_not_a_number_is_refused_naming_it(
    param: str, value: object, problem: str
) -> None:
    """The TTS class checks its params before it loads (``step_limits``: what a
    config's check asks), with the param's name; a right one passes."""
    pytest.importorskip("onnxruntime")
    from stages.voice.tts import PiperTts

    with pytest.raises(ValueError, match=rf"{param} must be {problem}"):
        PiperTts.step_limits({param: value})
    assert PiperTts.step_limits({param: 0.75}) is not None


def test_check_config_names_a_bad_later_phrase_min_slack_s(tmp_path: Path) -> None:
    """``omnitrio check-config`` (the config's load) refuses the voice chat's config
    with ``later_phrase_min_slack_s`` not a number, naming the param."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from omnitrio import ConfigError
    from omnitrio._config import load_config

    repo = Path(__file__).resolve().parents[3]
    text = (repo / "configs" / "voice-chat.yaml").read_text()
    assert "later_phrase_min_slack_s: 0.75 " in text
    bad = tmp_path / "voice-chat.yaml"
    for wrong, problem in (("-0.5", "at least 0"), ("0.75s", "a number of seconds")):
        bad.write_text(
            text.replace("later_phrase_min_slack_s: 0.75 ", f"later_phrase_min_slack_s: {wrong} ")
        )
        with pytest.raises(ConfigError, match=rf"later_phrase_min_slack_s must be {problem}"):
            load_config(bad)


def test_a_first_phrase_cut_s_that_is_not_a_number_is_refused() -> None:
    """``first_phrase_cut_s: .nan`` is refused like a negative one (a comparison with
    NaN is false either way round)."""
    pytest.importorskip("onnxruntime")
    from stages.voice.tts import PiperTts

    params = {"first_chunk_frames": 24, "first_part_words": 4}
    with pytest.raises(ValueError, match="first_phrase_cut_s needs first_part_words and must"):
        PiperTts.step_limits({**params, "first_phrase_cut_s": float("nan")})
    assert PiperTts.step_limits({**params, "first_phrase_cut_s": 0.2}) is not None
