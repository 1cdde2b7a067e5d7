"""The upload trust boundary (omnitrio/server/_audio_gate.py): formats decided from the
bytes against the whitelist, the demuxer named, and refusals that say nothing of files."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from omnitrio.server._audio import wav_bytes
from omnitrio.server._audio_gate import (
    FORMATS,
    OUT_RATE_HZ,
    UNSUPPORTED,
    DecodeLimits,
    UnsupportedAudio,
    decode,
    sniff_demuxer,
)

LIMITS = DecodeLimits(8000, 96000, 60.0)
RATE_HZ = 24000


def encoded(
    container: str,
    codec: str,
    rate_hz: int = RATE_HZ,
    *,
    layout: str = "mono",
    samples: np.ndarray | None = None,
    repeat: int = 1,
) -> bytes:
    """``samples`` (packed PCM16, [1, N x channels]; by default one second of a tone)
    ``repeat`` times over, in ``container`` / ``codec``, encoded by PyAV."""
    if samples is None:
        samples = (np.sin(np.arange(rate_hz) / 10) * 8000).astype(np.int16)[None, :]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as muxer:
        stream = muxer.add_stream(codec, rate=rate_hz)
        stream.layout = layout
        for _ in range(repeat):
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout=layout)
            frame.sample_rate = rate_hz
            for packet in stream.encode(frame):
                muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize(
    ("container", "codec", "rate_hz", "demuxer"),
    [
        ("mp3", "libmp3lame", RATE_HZ, "mp3"),
        ("ogg", "libopus", 48000, "ogg"),
        ("flac", "flac", RATE_HZ, "flac"),
        ("adts", "aac", RATE_HZ, "aac"),
        ("ipod", "aac", RATE_HZ, "mov"),  # m4a
        ("mp4", "aac", RATE_HZ, "mov"),
        ("webm", "libopus", 48000, "matroska"),
    ],
)
def test_each_promised_format_is_sniffed_and_decoded(
    container: str, codec: str, rate_hz: int, demuxer: str
) -> None:
    data = encoded(container, codec, rate_hz)
    assert sniff_demuxer(data) == demuxer
    pcm16 = decode(data, demuxer, LIMITS)
    assert len(pcm16) // 2 == pytest.approx(OUT_RATE_HZ, rel=0.1)  # one second


def test_wav_and_declared_raw_pcm() -> None:
    pcm = b"\x00\x10" * RATE_HZ
    assert sniff_demuxer(wav_bytes(pcm, RATE_HZ)) == "wav"
    assert len(decode(wav_bytes(pcm, RATE_HZ), "wav", LIMITS)) == 2 * OUT_RATE_HZ
    with pytest.raises(UnsupportedAudio):
        sniff_demuxer(pcm)  # raw bytes are PCM only when the client says so
    assert sniff_demuxer(pcm, declared_pcm=True) == "s16le"
    assert len(decode(pcm, "s16le", LIMITS)) == 2 * OUT_RATE_HZ


HOSTILE = {
    "ffconcat": b"ffconcat version 1.0\nfile private/memo.mp3\n",
    "sdp": b"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\n"
    b"m=audio 47000 RTP/AVP 0\na=rtpmap:0 PCMU/8000\n",
    "hls": b"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:///etc/passwd\n",
    "dash": b'<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011"></MPD>',
    "tee": b"[f=wav]out.wav|[f=wav]/tmp/x.wav",
    "image2": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,
    "text": b"not audio at all",
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_anything_else_is_unsupported_and_says_nothing_more(name: str) -> None:
    with pytest.raises(UnsupportedAudio) as caught:
        sniff_demuxer(HOSTILE[name])
    assert str(caught.value) == (  # the same words for every file: nothing of its bytes
        f"{UNSUPPORTED}: send one of {FORMATS} (or raw PCM16 as .pcm)"
    )


@pytest.mark.parametrize("demuxer", ["concat", "sdp", "rtp", "hls", "image2", "tee", "lavfi"])
def test_the_decoder_opens_no_demuxer_off_the_list(demuxer: str) -> None:
    with pytest.raises(UnsupportedAudio, match=UNSUPPORTED):
        decode(HOSTILE["ffconcat"], demuxer, LIMITS)


def test_a_file_that_lies_about_its_format_gets_the_same_words() -> None:
    # RIFF/WAVE magic, then an ffconcat script: the wav demuxer, not concat, reads it.
    data = b"RIFF\x00\x00\x00\x00WAVE" + HOSTILE["ffconcat"]
    with pytest.raises(UnsupportedAudio) as caught:
        decode(data, sniff_demuxer(data), LIMITS)
    assert str(caught.value) == f"{UNSUPPORTED}: the file's audio could not be decoded"


def test_the_input_limits_hold_while_decoding() -> None:
    long = wav_bytes(b"\x00\x10" * RATE_HZ * 3, RATE_HZ)
    with pytest.raises(UnsupportedAudio, match="over the limit of 2 s"):
        decode(long, "wav", DecodeLimits(8000, 96000, 2.0))
    with pytest.raises(UnsupportedAudio, match="outside the supported"):
        decode(long, "wav", DecodeLimits(32000, 96000, 60.0))
