"""Uploads decoded in worker processes (omnitrio/server/_decoders.py, through
_transcribe.decode_audio): the round-3 decoder attacks get a typed refusal and reach
no file or socket, and a decode is cancelled or timed out at once, its worker killed
and nothing left behind."""

from __future__ import annotations

import io
import time
from functools import partial
from pathlib import Path

import av
import httpx
import numpy as np
import psutil
import pytest
import trio

from omnitrio.server import ServerSettings, serve
from omnitrio.server._audio import wav_bytes
from omnitrio.server._audio_gate import UNSUPPORTED, DecodeLimits
from omnitrio.server._decoders import DecoderPool, DecodeTimeout
from omnitrio.server._shares import ClientShares
from omnitrio.server._transcribe import DECODE_RATE_HZ, UndecodableAudio, decode_audio
from tests.server.test_audio_gate import encoded
from tests.voice_support import VOICE_CONFIG, needs_voice

SETTINGS = ServerSettings()
LIMITS = DecodeLimits(8000, 96000, 600.0)
SECOND = wav_bytes(b"\x00\x10" * 16000, 16000)


def _children() -> list[psutil.Process]:
    """This process's decoder workers (other tests' children left out)."""
    workers = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any(arg.endswith("_audio_gate.py") for arg in child.cmdline()):
                workers.append(child)
        except psutil.NoSuchProcess:  # ended meanwhile
            continue
    return workers


def _udp_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with open(table) as lines:
            next(lines)
            ports |= {int(line.split()[1].rsplit(":", 1)[1], 16) for line in lines}
    return ports


async def test_an_ffconcat_upload_reads_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "memo.wav").write_bytes(wav_bytes(b"\x00\x10" * 8000, 8000))
    script = b"ffconcat version 1.0\nfile private/memo.wav\n"
    # The attack, as it was: FFmpeg's own probing opens the script's file.
    with av.open(io.BytesIO(script)) as probed:
        assert sum(frame.samples for frame in probed.decode(audio=0)) == 8000
    shares = ClientShares(4, 2, 2)
    try:
        for name in (None, "memo.mp3", "memo.wav"):
            with pytest.raises(UndecodableAudio) as caught:
                await decode_audio(script, SETTINGS, shares, "attacker", name)
            assert str(caught.value).startswith(UNSUPPORTED)
            assert "memo" not in str(caught.value)
        # Declared raw PCM: the script's own bytes as samples, nothing read besides.
        pcm16 = await decode_audio(script, SETTINGS, shares, "attacker", "memo.pcm")
        assert len(pcm16) < len(script)
        pcm16 = await decode_audio(SECOND, SETTINGS, shares, "other", "a.wav")
        assert len(pcm16) == 2 * DECODE_RATE_HZ  # another client, served meanwhile
    finally:
        await shares.decoders.aclose()
    assert not _children()


async def test_an_sdp_upload_binds_no_socket() -> None:
    sdp = (
        b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        b"m=audio 47012 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    before = _udp_ports()
    shares = ClientShares(4, 2, 2)
    try:
        with trio.fail_after(5):
            with pytest.raises(UndecodableAudio, match=UNSUPPORTED):
                await decode_audio(sdp, SETTINGS, shares, "attacker", "call.sdp")
    finally:
        await shares.decoders.aclose()
    assert not {47012, 47013} & _udp_ports() - before
    assert not _children()


async def test_a_cancelled_decode_kills_its_worker_at_once() -> None:
    big = wav_bytes(b"\x00\x10" * 96000 * 60, 96000)  # a minute at 96 kHz: 11 MB
    pool = DecoderPool(2, timeout_s=60.0)
    assert len(await pool.decode(SECOND, "wav", LIMITS)) == 2 * DECODE_RATE_HZ  # warm
    with trio.move_on_after(0.05) as scope:
        await pool.decode(big, "wav", LIMITS)
    assert scope.cancelled_caught
    started = time.monotonic()
    assert pool.num_killed == 1
    assert pool.num_idle == 0
    assert len(await pool.decode(SECOND, "wav", LIMITS)) == 2 * DECODE_RATE_HZ  # a new worker
    assert time.monotonic() - started < 10
    await pool.aclose()
    assert not _children()


async def test_a_decode_past_its_time_is_refused_and_its_worker_killed() -> None:
    big = wav_bytes(b"\x00\x10" * 96000 * 60, 96000)
    shares = ClientShares(4, 1, 2, decode_timeout_s=0.01)  # ServerSettings.decode_timeout_s
    pool = shares.decoders
    with pytest.raises(DecodeTimeout, match=r"took over 0\.01 s"):
        await shares.decode("slow", big, "wav", LIMITS)
    assert pool.num_killed == 1
    assert not shares.queued  # its share given back
    await pool.aclose()
    assert not _children()


def _flac_bomb(minutes: int) -> bytes:
    """``minutes`` of 96 kHz 7.1 silence as FLAC: ~245 KB for ten minutes."""
    second = np.zeros((1, 96000 * 8), np.int16)  # packed: [1, samples x channels]
    return encoded("flac", "flac", 96000, layout="7.1", samples=second, repeat=60 * minutes)


@needs_voice
@pytest.mark.usefixtures("voice_weights")
async def test_the_attacks_through_the_server_and_a_prompt_stop_mid_decode(
    tmp_path: Path,
) -> None:
    """ffconcat and SDP uploads get a typed 400 beside another client's transcription;
    a decode that takes seconds (ten minutes of 7.1 FLAC, allowed here) ends as soon
    as the server is stopped, its worker process killed."""
    settings = ServerSettings(port=0, max_input_audio_s=600.0)
    bomb = _flac_bomb(10)
    one_s = wav_bytes(b"\x00\x00" * 16000, 16000)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, VOICE_CONFIG, settings)
        base = f"{binds[0]}/v1/audio/transcriptions"

        def post(name: str, data: bytes) -> httpx.Response:
            return httpx.post(base, files={"file": (name, data)}, timeout=60)

        for name, data in {
            "memo.mp3": b"ffconcat version 1.0\nfile private/memo.mp3\n",
            "call.sdp": b"v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 47014 RTP/AVP 0\r\n",
        }.items():
            answer = await trio.to_thread.run_sync(post, name, data)
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == "invalid_audio"
            assert answer.json()["error"]["message"].startswith(f"file: {UNSUPPORTED}")
        assert (await trio.to_thread.run_sync(post, "quiet.wav", one_s)).status_code == 200
        nursery.start_soon(
            partial(trio.to_thread.run_sync, post, "bomb.flac", bomb, abandon_on_cancel=True)
        )
        (worker,) = _children()  # quiet.wav's, idle now: the bomb goes to it
        busy_s = sum(worker.cpu_times()[:2])
        await trio.sleep(1.0)  # into the decode (~7 s in all)
        assert sum(worker.cpu_times()[:2]) > busy_s + 0.2
        stopped = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - stopped < 2.0
    assert not _children()
