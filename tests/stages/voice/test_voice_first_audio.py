"""first_audio.py's hold: a stream whose first phrase is out waits while a first phrase
is synthesised, and only then; others never wait."""

from __future__ import annotations

import threading

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
