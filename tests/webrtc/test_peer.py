"""The call's two audio edges in aiortc: received packets handed on as they arrive, and
the answer's first frame sent as soon as its audio comes."""

from __future__ import annotations

import asyncio

from aiortc.rtp import RtpPacket

from omnitrio.webrtc import Playout
from omnitrio.webrtc._peer import OutgoingAudioTrack, PacketFrames
from omnitrio.webrtc._playout import FRAME_SAMPLES, TRACK_RATE_HZ


def _packet(number: int) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=number, timestamp=960 * number)
    packet._data = bytes([number % 256])  # type: ignore[attr-defined]  # as aiortc's receiver sets it
    return packet


def test_each_packet_is_a_frame_at_once_and_a_late_one_is_dropped() -> None:
    frames = PacketFrames()
    handed = []
    for number in (65534, 65535, 0, 2, 1, 2, 3):  # wraps; 1 comes after 2; 2 twice
        _, frame = frames.add(_packet(number))
        handed.append(None if frame is None else frame.timestamp // 960)
    assert handed == [65534, 65535, 0, 2, None, None, 3]


def test_audio_coming_to_a_silent_track_goes_before_its_frame_time() -> None:
    async def call() -> tuple[bool, float, float]:
        loop = asyncio.get_running_loop()
        playout = Playout(10 * FRAME_SAMPLES, lambda: None)
        track = OutgoingAudioTrack(playout)
        await track.recv()  # the clock starts: silence
        due = loop.time() + FRAME_SAMPLES / TRACK_RATE_HZ
        loop.call_later(0.002, playout.offer, "item_a", b"\x10\x27" * FRAME_SAMPLES)
        frame = await track.recv()
        sent = loop.time()
        await track.recv()  # the next one a whole frame after the early one
        return bool(frame.to_ndarray().any()), due - sent, loop.time() - sent

    had_audio, early_s, next_after_s = asyncio.run(call())
    assert had_audio
    assert early_s > 0.005  # offered 2 ms in: not held to the 20 ms tick
    assert next_after_s >= 0.019  # then the clock runs from it
