"""first_audio.py's hold: a stream whose first phrase is out waits while a first phrase
is synthesised, and only then; others never wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stages.voice.first_audio import FirstAudio


def _holding(gate: FirstAudio, stream_id: str) -> threading.Thread:
    thread = threading.Thread(target=gate.hold, args=(stream_id,), daemon=True)
    thread.start()
    return thread


def test_a_speaking_stream_holds_until_the_synthesis_ends() -> None:
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.first_phrase_out("speaking")
    with gate.synthesizing():
        speaking, writing = _holding(gate, "speaking"), _holding(gate, "writing")
        writing.join(timeout=60)
        assert not writing.is_alive()  # its first phrase is not out: no wait
        speaking.join(timeout=0.2)
        assert speaking.is_alive()  # held while the synthesis runs
    speaking.join(timeout=60)
    assert not speaking.is_alive()
    assert gate.held_s > 0


def test_no_hold_without_a_synthesis_or_after_the_stream_is_forgotten() -> None:
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.first_phrase_out("s")
    idle = _holding(gate, "s")
    idle.join(timeout=60)
    assert not idle.is_alive()
    gate.forget("s")
    with gate.synthesizing():
        forgotten = _holding(gate, "s")
        forgotten.join(timeout=60)
        assert not forgotten.is_alive()
    assert gate.held_s == 0


def test_a_hold_ends_at_its_cap() -> None:
    gate = FirstAudio()
    gate.max_hold_s = 0.01
    gate.first_phrase_out("s")
    with gate.synthesizing():
        capped = _holding(gate, "s")
        capped.join(timeout=60)
        assert not capped.is_alive()
    assert gate.held_s >= 0.01


def test_with_hold_for_starting_a_speaking_stream_waits_for_another_answers_first_audio() -> None:
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.hold_for_starting = True
    gate.first_phrase_out("speaking")
    gate.answer_starting("new")  # its ASR step began
    speaking = _holding(gate, "speaking")
    speaking.join(timeout=0.2)
    assert speaking.is_alive()  # held: no synthesis yet, but an answer is starting
    gate.answer_starting("speaking")  # its own start never holds it (a new turn)
    gate.first_audio_made("new")
    gate.first_audio_made("speaking")
    speaking.join(timeout=60)
    assert not speaking.is_alive()
    starting_alone = _holding(gate, "new")  # its own first phrase is not out: no wait
    starting_alone.join(timeout=60)
    assert not starting_alone.is_alive()


def _beside_a_start(*, through: bool) -> FirstAudio:
    """A gate with an answer speaking and a new one starting (``hold_for_starting``)."""
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.hold_for_starting = True
    gate.through_first_phrase = through
    gate.first_phrase_out("speaking")
    gate.answer_starting("new")
    return gate


def test_through_the_first_phrase_an_answer_holds_the_others_until_its_phrase_is_whole() -> None:
    """``through_first_phrase``: a new answer's first audio does not end the others' hold;
    its first phrase made whole does."""
    gate = _beside_a_start(through=True)
    speaking = _holding(gate, "speaking")
    gate.first_audio_made("new")  # its first part is out, the phrase not yet whole
    speaking.join(timeout=0.2)
    assert speaking.is_alive()
    gate.first_phrase_made("new")
    speaking.join(timeout=60)
    assert not speaking.is_alive()


def test_without_through_first_phrase_the_first_audio_ends_the_hold() -> None:
    gate = _beside_a_start(through=False)
    gate.first_phrase_made("new")  # counts only with through_first_phrase
    speaking = _holding(gate, "speaking")
    speaking.join(timeout=0.2)
    assert speaking.is_alive()
    gate.first_audio_made("new")
    speaking.join(timeout=60)
    assert not speaking.is_alive()


def test_through_the_first_phrase_a_start_counts_for_longer_but_not_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import stages.voice.first_audio as first_audio

    # its own cap far off, so a held thread slow to look (a loaded machine) still sees it
    monkeypatch.setattr(first_audio, "THROUGH_MAX_S", 600.0)
    gate = _beside_a_start(through=True)
    gate._starting["new"] -= first_audio.STARTING_MAX_S + 0.1  # past the first audio's cap
    held = _holding(gate, "speaking")
    held.join(timeout=0.2)
    assert held.is_alive()
    gate._starting["new"] -= first_audio.THROUGH_MAX_S  # and past its own
    with gate._changed:
        gate._changed.notify_all()
    held.join(timeout=60)
    assert not held.is_alive()


def test_without_hold_for_starting_or_once_forgotten_a_starting_answer_holds_nobody() -> None:
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.first_phrase_out("speaking")
    gate.answer_starting("new")
    free = _holding(gate, "speaking")  # hold_for_starting is off
    free.join(timeout=60)
    assert not free.is_alive()
    gate.hold_for_starting = True
    gate.forget("new")  # dropped before its first audio (a speculation)
    dropped = _holding(gate, "speaking")
    dropped.join(timeout=60)
    assert not dropped.is_alive()
    assert gate.held_s == 0


def test_a_start_counts_only_for_a_while() -> None:
    import stages.voice.first_audio as first_audio

    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.hold_for_starting = True
    gate.first_phrase_out("speaking")
    gate.answer_starting("lost")  # its TTS never saw it
    gate._starting["lost"] -= first_audio.STARTING_MAX_S + 1  # started long ago
    stale = _holding(gate, "speaking")
    stale.join(timeout=60)
    assert not stale.is_alive()
    assert gate.held_s == 0


def test_an_answers_own_first_part_holds_its_own_tokens_only_meanwhile() -> None:
    """first_part_pauses_answer: while an answer's first part is synthesised, its own
    next token waits though its first phrase is not out; other writing answers don't."""
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    with gate.synthesizing(own="own"):
        own, other = _holding(gate, "own"), _holding(gate, "other")
        other.join(timeout=60)
        assert not other.is_alive()  # another answer still writing its first phrase
        own.join(timeout=0.2)
        assert own.is_alive()  # held while its own first part is made
    own.join(timeout=60)
    assert not own.is_alive()
    assert gate.held_s > 0
    after = _holding(gate, "own")  # its first part made: it writes on unheld
    after.join(timeout=60)
    assert not after.is_alive()


def test_a_forgotten_answer_is_no_longer_held_for_its_first_part() -> None:
    gate = FirstAudio()
    gate.max_hold_s = 600.0
    with gate.synthesizing(own="gone"):
        gate.forget("gone")  # closed (a dropped speculation) while its part was made
        freed = _holding(gate, "gone")
        freed.join(timeout=60)
        assert not freed.is_alive()


def test_with_min_slack_an_answer_holds_only_while_its_audio_ahead_affords_it() -> None:
    """``min_slack_s``: an answer with little audio ahead is not held at all; one with
    more is held only until its audio ahead is down to ``min_slack_s``, though the
    synthesis goes on; one with no audio made yet is not held."""
    import time

    gate = FirstAudio()
    gate.max_hold_s = 600.0
    gate.min_slack_s = 1.0
    now = time.monotonic()
    for sid in ("short", "ahead", "silent"):
        gate.first_phrase_out(sid)
    gate.audio_made("short", now + 0.5)  # 0.5 s ahead: under the slack
    gate.audio_made("ahead", now + 1.6)  # may hold ~0.6 s
    with gate.synthesizing():
        short, silent = _holding(gate, "short"), _holding(gate, "silent")
        ahead = _holding(gate, "ahead")
        short.join(timeout=60)
        silent.join(timeout=60)
        assert not short.is_alive()
        assert not silent.is_alive()
        ahead.join(timeout=0.2)
        assert ahead.is_alive()  # held while it can afford it
        ahead.join(timeout=60)
        assert not ahead.is_alive()  # its slack spent: on, the synthesis still running
        held_until = time.monotonic()
    assert held_until - now >= 1.6 - 1.0 - 0.05
    assert gate.held_s > 0.3
    gate.forget("ahead")
    with gate.synthesizing():
        forgotten = _holding(gate, "ahead")  # its audio forgotten with it
        forgotten.join(timeout=60)
        assert not forgotten.is_alive()


@pytest.mark.parametrize(
    ("params", "refusal"),
    [
        (
            {"first_audio_first": True, "first_audio_through_first_phrase": True},
            r"first_audio_through_first_phrase acts only with first_audio_from_asr, which is off",
        ),
        (
            {"first_audio_from_asr": True},
            r"first_audio_from_asr acts only with first_audio_first, which is off",
        ),
        (
            {"first_audio_min_slack_s": 1.5},
            r"first_audio_min_slack_s acts only with first_audio_first, which is off",
        ),
        (
            {"first_audio_first": True, "first_audio_min_slack_s": -1},
            r"first_audio_min_slack_s must be at least 0 or null",
        ),
    ],
)
def test_a_first_audio_param_that_would_do_nothing_is_refused_naming_it(
    params: dict[str, object], refusal: str
) -> None:
    """A param that acts only with another is refused while that one is off (it was
    ignored), naming the stage and both params, before the model loads."""
    pytest.importorskip("torch")
    from stages.voice.llm import SmolLM2Llm

    with pytest.raises(ValueError, match=rf"stage 'llm': {refusal}"):
        SmolLM2Llm("llm", runtime="ctranslate2", model_path="/nowhere", **params)  # type: ignore[arg-type]


def test_the_first_audio_params_set_the_gate() -> None:
    from stages.voice.first_audio_params import FirstAudioParams

    gate = FirstAudio()
    FirstAudioParams(True, True, 1.5, True).apply(gate)
    assert (gate.hold_for_starting, gate.min_slack_s, gate.through_first_phrase) == (
        True,
        1.5,
        True,
    )
    FirstAudioParams(True).apply(gate)
    assert (gate.hold_for_starting, gate.min_slack_s, gate.through_first_phrase) == (
        False,
        None,
        False,
    )


def test_a_config_whose_first_audio_param_would_do_nothing_is_a_config_error(
    tmp_path: Path,
) -> None:
    """``omnitrio check-config`` (and so a server's start) names the param: the voice
    chat's config with ``first_audio_from_asr`` off keeps ``first_audio_through_first_phrase``
    on."""
    pytest.importorskip("torch")
    from omnitrio import ConfigError
    from omnitrio._config import load_config

    repo = Path(__file__).resolve().parents[3]
    text = (repo / "configs" / "voice-chat.yaml").read_text()
    assert "first_audio_from_asr: true" in text
    load_config(repo / "configs" / "voice-chat.yaml")  # the config as it is passes
    bad = tmp_path / "voice-chat.yaml"
    bad.write_text(text.replace("first_audio_from_asr: true", "first_audio_from_asr: false"))
    with pytest.raises(ConfigError, match=r"first_audio_through_first_phrase acts only with"):
        load_config(bad)


def test_a_hold_is_logged_for_the_trace_with_what_it_held_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With tracing on (``--trace``), each hold is a ``voice-held`` line: the stream,
    since and until when (monotonic s), and the answers it held for
    (benchmarks/voice_late_parts.py reads it)."""
    import time

    from stages.voice import trace

    monkeypatch.setattr(trace, "ENABLED", True)
    caplog.set_level("INFO", logger="stages.voice.trace")
    gate = FirstAudio()
    gate.hold_for_starting = True
    gate.first_phrase_out("speaking")
    gate.answer_starting("newcomer")
    gate.max_hold_s = 0.05
    before = time.monotonic()
    gate.hold("speaking")
    (line,) = [r.getMessage() for r in caplog.records if "voice-held" in r.getMessage()]
    name, stream_id, since, until, why = line.split()
    assert (name, stream_id, why) == ("voice-held", "speaking", "synth=0;starting=newcomer")
    assert before <= float(since) <= float(until) - 0.04


def test_a_later_phrase_may_wait_at_the_tts_only_while_another_answer_starts_and_it_can() -> None:
    """The TTS param ``later_phrase_min_slack_s``: a speaking answer's later phrase waits
    while another answer is on its way to its first audio (whatever the LLM's hold is
    set to), and only with more audio ahead than the slack."""
    gate = FirstAudio()
    gate.first_phrase_out("playing")
    gate.audio_made("playing", time.monotonic() + 5.0)
    assert not gate.later_may_wait("playing", 1.0)  # nobody starting
    gate.answer_starting("new")
    assert gate.later_may_wait("playing", 1.0)
    assert not gate.later_may_wait("playing", 10.0)  # too little audio ahead
    assert not gate.later_may_wait("new", 1.0)  # its own start, no audio made
    gate.first_audio_made("new")  # without through_first_phrase: its start ends here
    assert not gate.later_may_wait("playing", 1.0)
    gate.answer_starting("other")
    gate.forget("playing")
    assert not gate.later_may_wait("playing", 1.0)  # forgotten
