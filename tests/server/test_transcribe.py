"""A transcription upload and its answer without a server (omnitrio/server/_transcribe.py):
the form checked, the upload decoded, the body in each response_format."""

from __future__ import annotations

import json

import pytest
from werkzeug.datastructures import MultiDict

from omnitrio.server import ServerSettings
from omnitrio.server._audio import wav_bytes
from omnitrio.server._requests import BadRequest, TranscriptionForm
from omnitrio.server._shares import ClientShares
from omnitrio.server._transcribe import (
    DECODE_RATE_HZ,
    UndecodableAudio,
    decode_audio,
    form_fields,
    prepare_transcription,
    transcription_body,
)


def test_the_sdks_form_encoding_becomes_fields() -> None:
    form = MultiDict(
        [
            ("model", "whisper-1"),
            ("timestamp_granularities[]", "segment"),
            ("timestamp_granularities[]", "word"),
            ("chunking_strategy[type]", "server_vad"),
        ]
    )
    assert form_fields(form) == {
        "model": "whisper-1",
        "timestamp_granularities": ["segment", "word"],
        "chunking_strategy": {"type": "server_vad"},
    }


def test_the_form_is_checked_against_the_stage() -> None:
    form = prepare_transcription({"language": "en", "response_format": "verbose_json"}, "en")
    assert form.response_format == "verbose_json"
    with pytest.raises(BadRequest) as caught:
        prepare_transcription({"language": "fr"}, "en")
    assert (caught.value.param, caught.value.code) == ("language", "unsupported_parameter")
    assert "'en'" in str(caught.value)
    with pytest.raises(BadRequest) as caught:
        prepare_transcription({"timestamp_granularities": ["segment"]}, "en")
    assert caught.value.param == "timestamp_granularities"
    with pytest.raises(BadRequest) as caught:
        prepare_transcription({"temperature": "abc"}, "en")
    assert caught.value.param == "temperature"


def test_the_body_in_each_format() -> None:
    texts, num_samples = [" Hello", "there. "], DECODE_RATE_HZ * 2
    body, mimetype = transcription_body(TranscriptionForm(), "en", texts, num_samples)
    assert (json.loads(body), mimetype) == ({"text": "Hello there."}, "application/json")
    body, mimetype = transcription_body(
        TranscriptionForm(response_format="text"), "en", texts, num_samples
    )
    assert (body, mimetype) == (b"Hello there.\n", "text/plain")
    body, _ = transcription_body(
        TranscriptionForm(response_format="verbose_json"), "en", texts, num_samples
    )
    verbose = json.loads(body)
    assert (verbose["language"], verbose["duration"]) == ("en", 2.0)
    assert verbose["segments"][0]["end"] == 2.0
    body, _ = transcription_body(TranscriptionForm(response_format="verbose_json"), "en", [], 0)
    assert json.loads(body)["segments"] == []


async def test_an_upload_is_decoded_to_the_streams_rate() -> None:
    pytest.importorskip("av")
    settings, shares = ServerSettings(), ClientShares(4, 2, 2)
    try:  # 1 s at 24 kHz
        pcm16 = await decode_audio(
            wav_bytes(b"\x00\x10" * 24000, 24000), settings, shares, "c", None
        )
        assert abs(len(pcm16) // 2 - DECODE_RATE_HZ) <= 32
        with pytest.raises(UndecodableAudio):
            await decode_audio(b"not audio at all", settings, shares, "c", None)
    finally:
        await shares.decoders.aclose()
