"""The answer's playout buffer between the trio side and aiortc's sender (sans threads)."""

from __future__ import annotations

import pytest

from omnitrio.webrtc import Playout
from omnitrio.webrtc._playout import FRAME_SAMPLES


def _pcm(samples: int, value: int = 1000) -> bytes:
    return value.to_bytes(2, "little", signed=True) * samples


def test_offer_takes_only_what_fits_and_frames_come_padded_with_silence() -> None:
    wakes: list[None] = []
    playout = Playout(2 * FRAME_SAMPLES, lambda: wakes.append(None))
    assert playout.offer("item_a", _pcm(3 * FRAME_SAMPLES)) == 2 * 2 * FRAME_SAMPLES  # full
    assert playout.offer("item_a", _pcm(10)) == 0
    frame, had_audio = playout.take_frame()
    assert had_audio
    assert frame == _pcm(FRAME_SAMPLES)
    assert len(wakes) == 1  # room was made: the trio side looks again
    assert playout.offer("item_a", _pcm(FRAME_SAMPLES // 2)) == FRAME_SAMPLES
    playout.take_frame()
    frame, had_audio = playout.take_frame()  # half audio, half silence
    assert had_audio
    assert frame == _pcm(FRAME_SAMPLES // 2) + bytes(FRAME_SAMPLES)
    assert not playout.idle()
    frame, had_audio = playout.take_frame()
    assert (frame, had_audio) == (bytes(2 * FRAME_SAMPLES), False)
    assert playout.idle()
    assert playout.played_ms("item_a") == (2 * FRAME_SAMPLES + FRAME_SAMPLES // 2) // 48


def test_clear_cuts_at_once_and_names_what_played() -> None:
    playout = Playout(10 * FRAME_SAMPLES, lambda: None)
    playout.offer("item_a", _pcm(4 * FRAME_SAMPLES))
    playout.take_frame()
    assert playout.clear() == "item_a"
    assert playout.played_ms("item_a") == 20
    assert playout.queued_samples == 0
    assert playout.take_frame() == (bytes(2 * FRAME_SAMPLES), False)
    assert playout.clear() is None  # nothing was playing


def test_a_buffer_smaller_than_a_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity_samples"):
        Playout(FRAME_SAMPLES - 1, lambda: None)


def test_audio_coming_to_a_silent_buffer_is_announced_once() -> None:
    playout = Playout(10 * FRAME_SAMPLES, lambda: None)
    came: list[None] = []
    playout.on_audio = lambda: came.append(None)
    assert not playout.starting()
    playout.offer("item_a", _pcm(FRAME_SAMPLES))
    playout.offer("item_a", _pcm(FRAME_SAMPLES))  # more to a buffer not empty: no news
    assert len(came) == 1
    assert playout.starting()  # audio waits, the track was silent
    playout.take_frame()
    assert not playout.starting()  # it is playing now
    playout.take_frame()
    playout.take_frame()  # ran dry: silence went out
    playout.offer("item_a", _pcm(FRAME_SAMPLES))
    assert len(came) == 2
    assert playout.starting()
