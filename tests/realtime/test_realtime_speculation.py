"""The speculative answer's state in the sans-io session (no sockets, no models): held
at a pause, dropped when speech goes on, taken over by the turn's response only when
its request is equal."""

from __future__ import annotations

from omnitrio.realtime import DropSpeculation, RealtimeSession, Speculate, StartResponse
from tests.realtime.test_realtime_protocol import send
from tests.realtime.test_realtime_turns import RATE_HZ, append, types, vad_session


def _paused_turn() -> tuple[RealtimeSession, int, Speculate]:
    """A session in a turn (speech from 200 ms) paused after speech ending at 1200 ms."""
    session = vad_session()
    [listen] = append(session, RATE_HZ)
    session.speech_started(listen.generation, 200)
    append(session, RATE_HZ // 2)
    [held] = session.speech_paused(listen.generation, 1200)
    assert isinstance(held, Speculate)
    assert held.request == session.speculate(listen.generation, 1200)
    return session, listen.generation, held


def test_a_turn_ending_at_the_pause_takes_the_speculation_over() -> None:
    session, generation, held = _paused_turn()
    append(session, RATE_HZ // 2)  # silence: the turn ends where it paused
    outs = session.speech_stopped(generation, 1200)
    assert "DropSpeculation" not in types(outs)
    start = outs[-1]
    assert isinstance(start, StartResponse)
    assert start.speculation_id == held.speculation_id
    assert start.request == held.request
    # Taken once: the next response runs its own stream.
    session.finish(start.response_id, "completed")
    again = send(session, {"type": "response.create"})[-1]
    assert isinstance(again, StartResponse)
    assert again.speculation_id is None


def test_speech_resuming_drops_the_speculation() -> None:
    session, generation, held = _paused_turn()
    assert session.speech_resumed() == [DropSpeculation(held.speculation_id)]
    append(session, RATE_HZ)
    start = session.speech_stopped(generation, 2000)[-1]
    assert isinstance(start, StartResponse)
    assert start.speculation_id is None


def test_a_later_end_drops_the_speculation_before_its_response_starts() -> None:
    session, generation, held = _paused_turn()
    append(session, RATE_HZ)
    outs = session.speech_stopped(generation, 2000)
    assert types(outs)[-3:] == ["DropSpeculation", "response.created", "StartResponse"]
    assert outs[-3] == DropSpeculation(held.speculation_id)
    start = outs[-1]
    assert isinstance(start, StartResponse)
    assert start.speculation_id is None
    assert start.request != held.request


def test_a_new_pause_replaces_the_speculation() -> None:
    session, generation, held = _paused_turn()
    append(session, RATE_HZ)
    drop, newer = session.speech_paused(generation, 2000)
    assert drop == DropSpeculation(held.speculation_id)
    assert isinstance(newer, Speculate)
    assert newer.speculation_id != held.speculation_id
    # A pause whose audio has not all arrived holds nothing, and drops the one before.
    assert session.speech_paused(generation, 9000) == [DropSpeculation(newer.speculation_id)]
    assert session.speech_resumed() == []


def test_speech_starting_or_a_new_detector_drops_the_speculation() -> None:
    session, generation, held = _paused_turn()
    outs = session.speech_started(generation, 1300)
    assert outs == [DropSpeculation(held.speculation_id)]  # in speech already: nothing else
    session, generation, held = _paused_turn()
    update = {"type": "server_vad", "silence_duration_ms": 700}
    outs = send(
        session,
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": update}}}},
    )
    assert types(outs) == ["DropSpeculation", "session.updated"]
    session, generation, held = _paused_turn()
    outs = session.turn_detection_failed(generation, "the detector stopped")
    assert types(outs) == ["DropSpeculation", "error", "session.updated"]


def test_a_client_response_create_drops_an_unequal_speculation() -> None:
    session, _, held = _paused_turn()
    outs = send(session, {"type": "response.create"})
    assert types(outs) == ["DropSpeculation", "response.created", "StartResponse"]
    assert outs[0] == DropSpeculation(held.speculation_id)
