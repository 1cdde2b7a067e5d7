"""server_vad turn detection in the sans-io Realtime session (no sockets, no models):
the server reports the detector's findings, the session commits, answers and barges in."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent

from omnitrio.realtime import (
    CancelResponse,
    Dialect,
    RealtimeSession,
    ServerEvent,
    SessionConfig,
    SideStageAudio,
    StartResponse,
)
from omnitrio.realtime._turns import END_PADDING_MS
from tests.realtime.test_realtime_protocol import _models_by_type, b64, pcm, send, wire

RATE_HZ = 24000


def vad_session(dialect: Dialect = "ga") -> RealtimeSession:
    session = RealtimeSession(SessionConfig("sess_vad", "voice", dialect=dialect, server_vad=True))
    session.start()
    return session


def types(outs: list[Any]) -> list[str]:
    return [o.type if isinstance(o, ServerEvent) else type(o).__name__ for o in outs]


def append(session: RealtimeSession, num_samples: int) -> list[Any]:
    return send(session, {"type": "input_audio_buffer.append", "audio": b64(pcm(num_samples))})


def test_server_vad_is_the_default_when_the_pipeline_has_a_detector() -> None:
    session = RealtimeSession(SessionConfig("s", "voice", server_vad=True))
    [created] = session.start()
    detection = created.fields["session"]["audio"]["input"]["turn_detection"]  # type: ignore[index]
    assert detection["type"] == "server_vad"
    [listen] = append(session, 480)
    assert isinstance(listen, SideStageAudio)
    assert listen.pcm16 == pcm(480)
    assert listen.options["silence_duration_ms"] == 500


def test_a_detected_turn_is_committed_and_answered() -> None:
    session = vad_session()
    [listen] = append(session, RATE_HZ)  # 1 s
    outs = session.speech_started(listen.generation, 200)
    assert types(outs) == ["input_audio_buffer.speech_started", "StopPlayback"]
    item_id = outs[0].fields["item_id"]
    append(session, RATE_HZ)
    outs = session.speech_stopped(listen.generation, 1500)
    assert types(outs) == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "StartResponse",
    ]
    assert outs[1].fields["item_id"] == item_id
    start = outs[-1]
    assert isinstance(start, StartResponse)
    assert start.request.audio is not None
    # The buffer was cut at the detected start and END_PADDING_MS after the end: 2 s
    # appended, 200 ms .. 1500 ms + padding committed; the rest stays for the next turn.
    assert len(start.request.audio.pcm16) == 2 * (RATE_HZ * (1500 + END_PADDING_MS - 200) // 1000)
    assert session.statistics().input_audio_buffered_s == (500 - END_PADDING_MS) / 1000
    assert session.statistics().response_state == "ACTIVE"


def test_a_speculative_request_is_the_one_the_turn_gets() -> None:
    session = vad_session()
    [listen] = append(session, RATE_HZ)
    session.speech_started(listen.generation, 200)
    append(session, RATE_HZ // 2)  # the detector heard a pause after speech ending at 1200
    speculated = session.speculate(listen.generation, 1200)
    assert speculated is not None
    assert session.statistics().input_audio_buffered_s == 1.3  # nothing was committed
    assert session.statistics().response_state == "IDLE"
    append(session, RATE_HZ // 2)  # more silence: the turn ends
    start = session.speech_stopped(listen.generation, 1200)[-1]
    assert isinstance(start, StartResponse)
    assert start.request == speculated


def test_a_speculative_request_differs_once_the_turn_goes_on() -> None:
    session = vad_session()
    [listen] = append(session, RATE_HZ)
    session.speech_started(listen.generation, 200)
    append(session, RATE_HZ // 2)
    speculated = session.speculate(listen.generation, 1200)
    append(session, RATE_HZ)  # speech resumed and ended later
    start = session.speech_stopped(listen.generation, 2000)[-1]
    assert isinstance(start, StartResponse)
    assert start.request != speculated


def test_no_speculation_without_the_audio_or_while_a_response_is_active() -> None:
    session = vad_session()
    [listen] = append(session, RATE_HZ)
    session.speech_started(listen.generation, 200)
    assert session.speculate(listen.generation, 990) is None  # 990 + padding not yet heard
    assert session.speculate(listen.generation + 1, 700) is None  # an old generation
    first = session.speech_stopped(listen.generation, 700)[-1]
    assert isinstance(first, StartResponse)
    append(session, RATE_HZ)
    session.speech_started(listen.generation, 1200)  # barge-in: the response is cancelling
    append(session, RATE_HZ)
    assert session.speculate(listen.generation, 1500) is None
    update = {"type": "server_vad", "create_response": False}
    send(
        session,
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": update}}}},
    )
    [listen] = append(session, RATE_HZ)
    session.finish(first.response_id, "completed")
    session.speech_started(listen.generation, 0)
    append(session, RATE_HZ)
    assert session.speculate(listen.generation, 500) is None  # no response would start


def test_speech_during_an_answer_cancels_it_and_answers_the_new_turn() -> None:
    session = vad_session()
    [listen] = append(session, RATE_HZ)
    session.speech_started(listen.generation, 0)
    first = session.speech_stopped(listen.generation, 900)[-1]
    assert isinstance(first, StartResponse)
    append(session, RATE_HZ)
    outs = session.speech_started(listen.generation, 1200)
    # The answer stops playing where the server plays it (WebRTC), and is cancelled.
    assert types(outs) == ["input_audio_buffer.speech_started", "StopPlayback", "CancelResponse"]
    assert outs[2] == CancelResponse(first.response_id)
    # The new turn ends before the cancelled answer is finished: its response waits ...
    outs = session.speech_stopped(listen.generation, 1800)
    assert "StartResponse" not in types(outs)
    assert "input_audio_buffer.committed" in types(outs)
    # ... and starts as the old one finishes.
    outs = session.finish(first.response_id, "completed")
    assert types(outs)[-3:] == ["response.done", "response.created", "StartResponse"]
    assert outs[-3].fields["response"]["status"] == "cancelled"  # type: ignore[index]


def test_interrupt_response_false_lets_the_answer_finish() -> None:
    session = vad_session()
    update = {"type": "server_vad", "interrupt_response": False, "silence_duration_ms": 200}
    send(
        session,
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": update}}}},
    )
    [listen] = append(session, RATE_HZ)
    assert listen.options["silence_duration_ms"] == 200
    session.speech_started(listen.generation, 0)
    first = session.speech_stopped(listen.generation, 900)[-1]
    assert isinstance(first, StartResponse)
    append(session, RATE_HZ)
    assert types(session.speech_started(listen.generation, 1200)) == [
        "input_audio_buffer.speech_started"
    ]


def test_reports_from_before_a_settings_change_are_ignored() -> None:
    session = vad_session()
    [old] = append(session, RATE_HZ)
    send(
        session,
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}},
    )
    assert session.speech_started(old.generation, 0) == []
    assert append(session, RATE_HZ) == []  # turn detection off: the client commits
    outs = send(session, {"type": "input_audio_buffer.commit"})
    assert types(outs)[0] == "input_audio_buffer.committed"
    on = {"type": "server_vad"}
    send(
        session, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": on}}}}
    )
    [new] = append(session, 480)
    assert new.generation != old.generation


def test_without_a_detector_server_vad_is_refused() -> None:
    session = RealtimeSession(SessionConfig("s", "synthetic"))
    [created] = session.start()
    assert created.fields["session"]["audio"]["input"]["turn_detection"] is None  # type: ignore[index]
    on = {"type": "server_vad"}
    [error, updated] = send(
        session, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": on}}}}
    )
    assert updated.type == "session.updated"
    assert error.fields["error"]["code"] == "unsupported_parameter"  # type: ignore[index]
    assert "no turn detector" in error.fields["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    "detection",
    [
        {"type": "semantic_vad", "eagerness": "eager"},
        {"type": "server_vad", "threshold": 2},
        {"silence_ms": 1},
    ],
)
def test_bad_turn_detection_gets_an_error(detection: dict[str, Any]) -> None:
    session = vad_session()
    patch = {"audio": {"input": {"turn_detection": detection}}}
    [error, updated] = send(session, {"type": "session.update", "session": patch})
    assert error.type == "error"
    shown = updated.fields["session"]["audio"]["input"]["turn_detection"]  # type: ignore[index]
    assert shown["silence_duration_ms"] == 500  # left as it was


@pytest.mark.parametrize(("eagerness", "silence_ms"), [("low", 1000), ("auto", 500), ("high", 250)])
def test_semantic_vad_is_served_by_the_detector_with_eagerness_as_silence(
    eagerness: str, silence_ms: int
) -> None:
    session = vad_session()
    asked = {"type": "semantic_vad", "eagerness": eagerness, "create_response": True}
    patch = {"audio": {"input": {"turn_detection": asked}}}
    [updated] = send(session, {"type": "session.update", "session": patch})
    shown = updated.fields["session"]["audio"]["input"]["turn_detection"]  # type: ignore[index]
    assert (shown["type"], shown["silence_duration_ms"]) == ("server_vad", silence_ms)
    [listen] = append(session, RATE_HZ)
    assert isinstance(listen, SideStageAudio)
    assert listen.options["silence_duration_ms"] == silence_ms


@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_the_sdk_parses_the_turn_events(dialect: Dialect) -> None:
    union = RealtimeServerEvent if dialect == "ga" else BetaServerEvent
    models = _models_by_type(union)
    session = vad_session(dialect)
    [listen] = append(session, RATE_HZ)
    events = [*session.speech_started(listen.generation, 0)]
    events += session.speech_stopped(listen.generation, 900)
    for event in events:
        if isinstance(event, ServerEvent):
            message = wire(session, event)
            models[message["type"]].model_validate(message)


def test_a_live_track_is_heard_and_never_refused() -> None:
    """WebRTC: the microphone goes in with hear(); without turn detection the buffer
    keeps the most recent max_input_audio_s instead of refusing the track's audio."""
    session = RealtimeSession(SessionConfig("s", "voice", max_input_audio_s=1.0, webrtc=True))
    session.start()
    for _ in range(30):  # 3 s of 100 ms frames into a 1 s buffer
        assert session.hear(pcm(RATE_HZ // 10)) == []
    assert session.statistics().input_audio_buffered_s == 1.0
    assert session.statistics().num_errors == 0


def test_output_audio_buffer_clear_is_for_webrtc_sessions() -> None:
    webrtc = RealtimeSession(SessionConfig("s", "voice", webrtc=True))
    webrtc.start()
    assert types(send(webrtc, {"type": "output_audio_buffer.clear"})) == ["StopPlayback"]
    websocket = RealtimeSession(SessionConfig("s", "voice"))
    websocket.start()
    [error] = send(websocket, {"type": "output_audio_buffer.clear"})
    assert error.fields["error"]["code"] == "unsupported_event_type"  # type: ignore[index]
