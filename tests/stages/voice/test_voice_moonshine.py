"""Moonshine base: the .ort -> .onnx conversion computes what the shipped model does,
and the ASR stage hears the suite's questions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnitrio import AudioInput, Event, Request, StreamWork, resample_float
from tests.voice_support import (
    INPUT_RATE_HZ,
    WHISPER_RATE_HZ,
    needs_voice,
    spoken,
    word_error_rate,
)

pytestmark = needs_voice

QUESTIONS = (
    "What do cats like to eat?",
    "Tell me a story about a dragon.",
    "Why is the sky blue, and why are sunsets red?",
    "What is a good name for a small dog?",
    "What is the weather like in Paris?",
)


def _samples(text: str, tmp_path: Path, voice: str = "piper") -> np.ndarray:
    from stages.voice.pcm import pcm16_to_float

    pcm16 = spoken(text, tmp_path / "q.wav", voice=voice)
    return resample_float(pcm16_to_float(pcm16), INPUT_RATE_HZ, WHISPER_RATE_HZ)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stages.voice.moonshine import ensure_converted

    return ensure_converted(str(tmp_path_factory.mktemp("cache")))


def test_the_converted_model_computes_what_the_shipped_one_does(
    converted: Path, tmp_path: Path
) -> None:
    import onnxruntime

    from stages.voice.moonshine import ModelFiles, Moonshine, packaged_model_dir

    shipped_dir = packaged_model_dir()
    shipped = Moonshine(
        ModelFiles(
            shipped_dir / "encoder_model.ort",
            shipped_dir / "decoder_model_merged.ort",
            shipped_dir / "tokenizer.bin",
        )
    )
    ours = Moonshine(
        ModelFiles(
            converted / "encoder_model.onnx",
            converted / "decoder_model_merged.onnx",
            converted / "tokenizer.bin",
        )
    )
    assert isinstance(ours.encoder, onnxruntime.InferenceSession)
    samples = _samples("What do cats like to eat?", tmp_path)
    feed = {"input_values": samples[None, :]}
    (hidden_shipped,) = shipped.encoder.run(None, feed)
    (hidden_ours,) = ours.encoder.run(None, feed)
    assert hidden_ours.shape == hidden_shipped.shape
    np.testing.assert_allclose(hidden_ours, hidden_shipped, rtol=1e-4, atol=1e-4)
    # The decoder: the same greedy tokens, step by step with its KV cache.
    assert ours.token_ids(samples) == shipped.token_ids(samples)
    assert ours.transcribe(samples) == "What do cats like to eat?"


def test_the_conversion_runs_once_and_a_cut_file_is_refused(
    converted: Path, tmp_path: Path
) -> None:
    from stages.voice.moonshine import ensure_converted, packaged_model_dir
    from stages.voice.ort_to_onnx import OrtFormatError, convert_ort_file

    stamp = (converted / "decoder_model_merged.onnx").stat().st_mtime_ns
    assert ensure_converted(str(converted.parent)) == converted
    assert (converted / "decoder_model_merged.onnx").stat().st_mtime_ns == stamp
    assert not [p for p in converted.parent.iterdir() if p.name.startswith(".convert-")]
    cut = tmp_path / "cut.ort"
    cut.write_bytes((packaged_model_dir() / "encoder_model.ort").read_bytes()[:4096])
    with pytest.raises(OrtFormatError, match=r"cut\.ort is damaged or cut short"):
        convert_ort_file(cut)
    not_ort = tmp_path / "x.ort"
    not_ort.write_bytes(b"\0" * 64)
    with pytest.raises(OrtFormatError, match=r"not an onnxruntime \.ort model"):
        convert_ort_file(not_ort)


def test_the_asr_stage_hears_the_suites_questions(converted: Path, tmp_path: Path) -> None:
    from stages.voice.asr import MoonshineAsr

    # The voice chat's threads: the encoder's pool on 2, the decoder on 1; neither spins.
    stage = MoonshineAsr(
        "asr", cache_dir=str(converted.parent), num_threads=2, decoder_num_threads=1
    )
    for session, threads in ((stage.model.encoder, 2), (stage.model.decoder, 1)):
        options = session.get_session_options()
        assert options.intra_op_num_threads == threads
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    for n, question in enumerate(QUESTIONS):
        sid = f"s{n}"
        pcm16 = spoken(question, tmp_path / f"{n}.wav", silence_after_s=0.3)
        stage.open_stream(sid, Request(audio=AudioInput(pcm16, INPUT_RATE_HZ)))
        (event,) = stage.step([StreamWork(sid, (), True)])[sid].visible
        stage.close_stream(sid)
        assert isinstance(event, Event)
        heard = str(event.data["text"])
        assert word_error_rate(question, heard) == 0.0, (question, heard)
    assert stage.audio_s > 5
    stage.close()


def test_a_model_dir_without_the_files_is_refused_naming_the_param(tmp_path: Path) -> None:
    from stages.voice.asr import MoonshineAsr
    from stages.voice.files import MissingModelFile

    with pytest.raises(MissingModelFile, match=r"param model_dir: .*encoder_model\.ort"):
        MoonshineAsr("asr", model_dir=str(tmp_path))
