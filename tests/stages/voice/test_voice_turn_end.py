"""Semantic end of turn: Smart Turn in the VAD stage decides whether a pause ends the
turn (the Realtime API's semantic_vad); a finished sentence ends at the decision
time, a sentence it hears as unfinished waits on through a long mid-sentence pause."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnitrio import Event, Request, StreamWork
from tests.voice_support import INPUT_RATE_HZ, needs_voice, paused_speech

pytestmark = needs_voice

CHUNK_BYTES = int(0.02 * INPUT_RATE_HZ) * 2


def _silence(seconds: float) -> bytes:
    return bytes(int(seconds * INPUT_RATE_HZ) * 2)


def _stops(vad: object, pcm16: bytes, options: dict[str, object] | None = None) -> list[int]:
    """When each speech_stopped came (ms of audio fed so far), feeding 20 ms chunks."""
    vad.open_stream("s", Request(options=options or {}))  # type: ignore[attr-defined]
    stops: list[int] = []
    for start in range(0, len(pcm16), CHUNK_BYTES):
        work = StreamWork("s", (pcm16[start : start + CHUNK_BYTES],), False)
        for item in vad.step([work])["s"].visible:  # type: ignore[attr-defined]
            if isinstance(item, Event) and item.name == "speech_stopped":
                stops.append((start + CHUNK_BYTES) * 1000 // (2 * INPUT_RATE_HZ))
    vad.close_stream("s")  # type: ignore[attr-defined]
    return stops


def _pauses(vad: object, pcm16: bytes) -> list[tuple[int, int]]:
    """Each speech_paused as (ms of audio fed so far, its ``audio_end_ms``), feeding 20 ms
    chunks."""
    vad.open_stream("s", Request())  # type: ignore[attr-defined]
    pauses: list[tuple[int, int]] = []
    for start in range(0, len(pcm16), CHUNK_BYTES):
        work = StreamWork("s", (pcm16[start : start + CHUNK_BYTES],), False)
        for item in vad.step([work])["s"].visible:  # type: ignore[attr-defined]
            if isinstance(item, Event) and item.name == "speech_paused":
                fed_ms = (start + CHUNK_BYTES) * 1000 // (2 * INPUT_RATE_HZ)
                pauses.append((fed_ms, int(item.data["audio_end_ms"])))
    vad.close_stream("s")  # type: ignore[attr-defined]
    return pauses


@pytest.fixture(scope="module")
def vads() -> tuple[object, object]:
    from stages.voice.vad import SileroVad

    return SileroVad("vad", smart_turn="all"), SileroVad("vad")


def test_a_finished_sentence_ends_the_turn_at_the_decision_time(
    vads: tuple[object, object], tmp_path: Path
) -> None:
    smart, _ = vads
    speech = paused_speech("Tell me a story about a dragon.", tmp_path, pause_s=0.0)
    speech_end_ms = len(speech) * 1000 // (2 * INPUT_RATE_HZ) + 500
    (stop,) = _stops(smart, _silence(0.5) + speech + _silence(3.0))
    assert speech_end_ms + 500 <= stop <= speech_end_ms + 500 + 200  # not the 2 s wait
    assert smart.turn_ends["finished"] >= 1  # type: ignore[attr-defined]


def test_a_mid_sentence_pause_does_not_end_the_turn_with_smart_turn(
    vads: tuple[object, object], tmp_path: Path
) -> None:
    smart, plain = vads
    # espeak-ng's reading, so that every run hears the same audio: Smart Turn hears
    # "Why is the sky blue, ..." as unfinished at the pause; silence alone ends it there.
    speech = paused_speech(
        "Why is the sky blue, | and why are sunsets red?", tmp_path, pause_s=0.7, voice="espeak"
    )
    audio = _silence(0.5) + speech + _silence(3.0)
    assert len(_stops(plain, audio)) == 2  # the pause was taken for the end
    assert len(_stops(smart, audio)) == 1


def test_a_turn_heard_as_unfinished_ends_at_the_latest_after_max_silence(
    tmp_path: Path,
) -> None:
    from stages.voice.vad import SileroVad

    vad = SileroVad("vad", smart_turn="all", smart_turn_threshold=0.999, max_silence_ms=1000)
    speech = paused_speech("Tell me a story about a dragon.", tmp_path, pause_s=0.0)
    speech_end_ms = len(speech) * 1000 // (2 * INPUT_RATE_HZ) + 500
    (stop,) = _stops(vad, _silence(0.5) + speech + _silence(3.0))
    assert speech_end_ms + 1000 <= stop <= speech_end_ms + 1000 + 200
    assert vad.turn_ends == {"finished": 0, "unfinished": 1}


def test_with_smart_turn_semantic_only_an_eagerness_stream_waits(tmp_path: Path) -> None:
    from stages.voice.vad import SileroVad

    vad = SileroVad("vad", smart_turn="semantic", smart_turn_threshold=0.999)
    speech = paused_speech("Tell me a story about a dragon.", tmp_path, pause_s=0.0)
    speech_end_ms = len(speech) * 1000 // (2 * INPUT_RATE_HZ) + 500
    audio = _silence(0.5) + speech + _silence(3.0)
    (server_vad,) = _stops(vad, audio)  # silence alone: 500 ms
    (semantic,) = _stops(vad, audio, {"eagerness": "medium"})  # heard as unfinished: 2 s
    assert speech_end_ms + 500 <= server_vad <= speech_end_ms + 600
    assert speech_end_ms + 2000 <= semantic <= speech_end_ms + 2200
    with pytest.raises(ValueError, match="smart_turn must be one of"):
        SileroVad("vad", smart_turn="yes")


def test_eagerness_picks_the_times_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    from stages.voice.vad import SileroVad

    vad = SileroVad("vad")  # no Smart Turn: eagerness picks the silence time only
    speech = paused_speech("Tell me a story about a dragon.", tmp_path, pause_s=0.0)
    speech_end_ms = len(speech) * 1000 // (2 * INPUT_RATE_HZ) + 500
    audio = _silence(0.5) + speech + _silence(3.0)
    (high,) = _stops(vad, audio, {"eagerness": "high"})
    (low,) = _stops(vad, audio, {"eagerness": "low"})
    assert speech_end_ms + 300 <= high <= speech_end_ms + 300 + 100
    assert speech_end_ms + 800 <= low <= speech_end_ms + 800 + 100
    with pytest.raises(ValueError, match=r"eagerness must be one of .* not 'eager'"):
        vad.open_stream("x", Request(options={"eagerness": "eager"}))


def test_the_pause_is_heard_as_the_audio_arrives(tmp_path: Path) -> None:
    """The detector resamples the microphone without holding audio back: each pause is
    reported in the 20 ms chunk that completes its windows of silence (the anti-aliased
    resampler held back ~21 ms on average, and the pause came 20-50 ms later)."""
    from stages.voice.vad import SileroVad

    vad = SileroVad("vad", pause_ms=120)
    pause_ms = -(-120 // vad.window_ms) * vad.window_ms  # whole windows: 128
    for question in ("What do cats like to eat?", "Why is the sky blue?"):
        speech = paused_speech(question, tmp_path, pause_s=0.0) + _silence(0.6)
        pauses = _pauses(vad, speech)
        fed_ms, end_ms = pauses[-1]
        assert 0 <= fed_ms - (end_ms + pause_ms) < 20, (question, pauses)


def test_the_voice_chat_pause_comes_with_the_turn_audio_it_speculates_on(
    tmp_path: Path,
) -> None:
    """With the voice chat's own VAD params, each pause is reported once the session holds
    the audio a turn ending there commits (``END_PADDING_MS`` past its ``audio_end_ms``):
    otherwise the speculative answer cannot be built at that pause (a pause shorter than
    the padding took ~1 speculation in 5 away, docs/benchmarks-voice.md)."""
    import omnitrio
    from omnitrio.realtime._turns import END_PADDING_MS
    from stages.voice.vad import SileroVad

    config = omnitrio.load_config(Path(__file__).parents[3] / "configs" / "voice-chat.yaml")
    assert config.side_stage is not None
    params = dict(config.side_stage.params)
    params.pop("smart_turn")  # the pause does not depend on it; not loading it is quicker
    vad = SileroVad("vad", **params)  # type: ignore[arg-type]
    assert vad.pause_ms is not None
    for question in ("Which animals live | in the ocean?", "How do I make | a cup of tea?"):
        speech = paused_speech(question, tmp_path, pause_s=0.4) + _silence(0.6)
        pauses = _pauses(vad, speech)
        assert len(pauses) >= 2, (question, pauses)  # the mid-sentence one and the last
        assert all(fed >= end + END_PADDING_MS for fed, end in pauses), (question, pauses)
