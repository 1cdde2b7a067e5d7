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

    tmp_path.mkdir(parents=True, exist_ok=True)
    pcm16 = spoken(text, tmp_path / "q.wav", voice=voice)
    return resample_float(pcm16_to_float(pcm16), INPUT_RATE_HZ, WHISPER_RATE_HZ)


def float_matrix_products(path: Path) -> tuple[int, int]:
    """In the ONNX model at ``path`` (its sub-graphs too): the MatMuls whose matrix is
    a float32 initializer, and the DynamicQuantizeMatMuls."""
    import onnx

    def count(graph: onnx.GraphProto, outer: set[str]) -> tuple[int, int]:
        floats = outer | {
            i.name for i in graph.initializer if len(i.dims) == 2 and i.data_type == 1
        }
        on_float = sum(n.op_type == "MatMul" and n.input[1] in floats for n in graph.node)
        on_u8 = sum(n.op_type == "DynamicQuantizeMatMul" for n in graph.node)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    more = count(attribute.g, floats)
                    on_float, on_u8 = on_float + more[0], on_u8 + more[1]
        return on_float, on_u8

    return count(onnx.load(str(path)).graph, set())


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


def test_the_8_bit_decoder_hears_what_the_float_one_does(converted: Path, tmp_path: Path) -> None:
    import onnxruntime

    from stages.voice.moonshine import U8_DECODER, ModelFiles, Moonshine, model_files

    u8 = model_files(None, str(converted.parent))
    assert u8.decoder == converted / U8_DECODER
    # Every product with a weight matrix on 8 bits (146 in the two branches of the
    # merged decoder, the output projection's included); attention's stay float.
    assert float_matrix_products(u8.decoder) == (0, 146)
    ours = Moonshine(u8)
    float32 = Moonshine(
        ModelFiles(u8.encoder, converted / "decoder_model_merged.onnx", u8.tokenizer)
    )
    assert isinstance(ours.decoder, onnxruntime.InferenceSession)
    for n, question in enumerate(QUESTIONS):
        samples = _samples(question, tmp_path / str(n))
        assert ours.token_ids(samples) == float32.token_ids(samples), question
    stamp = u8.decoder.stat().st_mtime_ns  # made once
    assert model_files(None, str(converted.parent)).decoder.stat().st_mtime_ns == stamp


def test_the_8_bit_encoder_hears_what_the_float_one_does(converted: Path, tmp_path: Path) -> None:
    from stages.voice.moonshine import U8_DECODER, U8_ENCODER, ModelFiles, Moonshine, model_files

    u8 = model_files(None, str(converted.parent), encoder_weights="uint8")
    assert (u8.encoder, u8.decoder) == (converted / U8_ENCODER, converted / U8_DECODER)
    # Every product with a weight matrix on 8 bits (48: attention's projections and the
    # feed-forward layers); attention's own products stay float.
    assert float_matrix_products(u8.encoder) == (0, 48)
    ours = Moonshine(u8)
    float32 = Moonshine(ModelFiles(converted / "encoder_model.onnx", u8.decoder, u8.tokenizer))
    for n, question in enumerate(QUESTIONS):
        samples = _samples(question, tmp_path / str(n))
        assert ours.token_ids(samples) == float32.token_ids(samples), question
    stamp = u8.encoder.stat().st_mtime_ns  # made once
    again = model_files(None, str(converted.parent), encoder_weights="uint8")
    assert again.encoder.stat().st_mtime_ns == stamp


def _merged_logits(model: object, hidden: np.ndarray) -> list[np.ndarray]:
    """The merged decoder's logits, step by step, until its greedy end token."""
    from stages.voice.moonshine import END_ID, START_ID, Moonshine

    assert isinstance(model, Moonshine)
    assert model.decoder is not None
    past = {name: model._empty for name in model._past}
    token, out = START_ID, []
    for step in range(40):
        feed = {"input_ids": np.array([[token]], np.int64), "encoder_hidden_states": hidden}
        feed |= {"use_cache_branch": np.array([step > 0]), **past}
        logits, *presents = model.decoder.run(None, feed)
        for name, value in zip(model._past, presents, strict=True):
            if step == 0 or ".decoder." in name:
                past[name] = value
        out.append(logits)
        token = int(np.argmax(logits[0, -1]))
        if token == END_ID:
            return out
    raise AssertionError("no end token in 40 steps")


def _split_logits(model: object, hidden: np.ndarray) -> list[np.ndarray]:
    """The split decoder's logits, step by step (each step fed the last one's
    outputs, as ``Moonshine.decode`` binds them), until its own token is the end."""
    from stages.voice.moonshine import END_ID, START_ID, Moonshine

    assert isinstance(model, Moonshine)
    assert model.steps is not None
    first, later = model.steps
    names = ["logits", *model._first_outputs]
    feed = {"input_ids": np.array([[START_ID]], np.int64), "encoder_hidden_states": hidden}
    made = dict(zip(names, first.run(names, feed), strict=True))
    fixed = {name: made[output] for name, output in model._fixed.items()}
    out, token = [made["logits"]], made["token"]
    cache = [made[name] for name in model._carried]
    while int(token[0, 0]) != END_ID:
        assert len(out) < 40, "no end token in 40 steps"
        assert int(token[0, 0]) == int(np.argmax(out[-1][0, -1]))  # the ArgMax is numpy's
        feed = {"input_ids": token, **fixed, **dict(zip(model._decoder_past, cache, strict=True))}
        logits, token, *cache = later.run(["logits", *model._next_outputs], feed)
        out.append(logits)
    return out


def test_the_split_decoder_computes_the_merged_ones_logits_bit_for_bit(
    converted: Path, tmp_path: Path
) -> None:
    import onnx

    from stages.voice.moonshine import Moonshine, model_files
    from stages.voice.moonshine_steps import SCALED_KEY

    merged_files = model_files(None, str(converted.parent), encoder_weights="uint8")
    files = model_files(None, str(converted.parent), encoder_weights="uint8", split_decoder=True)
    assert files.steps is not None
    assert files.decoder == merged_files.decoder
    merged = Moonshine(merged_files, num_threads=2, decoder_num_threads=1)
    split = Moonshine(files, num_threads=2, decoder_num_threads=1)
    assert merged.steps is None
    assert split.decoder is None
    later = onnx.load(str(files.steps[1]))
    # No If, no transposing of the cross-attention's keys at every step: they come in
    # transposed and scaled, made once by the first step.
    assert not [n for n in later.graph.node if n.op_type == "If"]
    inputs = {i.name for i in later.graph.input}
    assert SCALED_KEY.format(layer=7) in inputs
    assert "past_key_values.0.encoder.key" not in inputs
    for n, question in enumerate(QUESTIONS):
        samples = _samples(question, tmp_path / str(n))
        hidden = merged.encode(samples)
        expected, got = _merged_logits(merged, hidden), _split_logits(split, hidden)
        assert len(got) == len(expected), question
        for step, (a, b) in enumerate(zip(expected, got, strict=True)):
            assert a.shape == b.shape, (question, step)
            assert np.array_equal(a, b), (question, step)
        # ... and decode (I/O binding, the step outputs bound as the next inputs as
        # they are) takes the same tokens as the merged decoder's loop.
        assert split.decode(hidden, samples.size) == merged.decode(hidden, samples.size)
        assert split.token_ids(samples) == merged.token_ids(samples)


def test_the_steps_are_made_once_and_again_for_a_newer_decoder(converted: Path) -> None:
    import os

    from stages.voice.moonshine import ensure_steps, model_files

    files = model_files(None, str(converted.parent), split_decoder=True)
    assert files.steps is not None
    stamps = [p.stat().st_mtime_ns for p in files.steps]
    assert ensure_steps(files.decoder) == files.steps
    assert [p.stat().st_mtime_ns for p in files.steps] == stamps
    made = files.decoder.stat().st_mtime_ns
    later = max(stamps) + 1
    os.utime(files.decoder, ns=(later, later))
    try:
        assert ensure_steps(files.decoder) == files.steps
        assert all(p.stat().st_mtime_ns >= later for p in files.steps)
    finally:
        os.utime(files.decoder, ns=(made, made))
    assert not [p for p in converted.iterdir() if p.name.startswith(".steps-")]


def test_signed_weights_compute_the_unsigned_ones_results_bit_for_bit(
    converted: Path, tmp_path: Path
) -> None:
    from stages.voice.moonshine import Moonshine, model_files
    from stages.voice.onnx_u8 import cpu_has_vnni

    cache = str(converted.parent)
    unsigned = model_files(None, cache, encoder_weights="uint8", split_decoder=True)
    signed = model_files(
        None, cache, encoder_weights="uint8", split_decoder=True, signed_weights=True
    )
    assert signed.encoder == converted / "encoder_model.u8.s8.onnx"
    assert signed.steps == (
        converted / "decoder_model_merged.u8.first.s8.onnx",
        converted / "decoder_model_merged.u8.next.s8.onnx",
    )
    stamps = [signed.encoder.stat().st_mtime_ns, *(p.stat().st_mtime_ns for p in signed.steps)]
    again = model_files(
        None, cache, encoder_weights="uint8", split_decoder=True, signed_weights=True
    )
    assert again == signed  # made once
    assert again.steps is not None
    assert [again.encoder.stat().st_mtime_ns, *(p.stat().st_mtime_ns for p in again.steps)] == (
        stamps
    )
    merged = model_files(None, cache, encoder_weights="uint8", signed_weights=True)
    assert merged.decoder == converted / "decoder_model_merged.u8.s8.onnx"
    if not cpu_has_vnni():
        pytest.skip("no VNNI: onnxruntime's u8 x s8 kernel may saturate on this CPU")
    ours = Moonshine(signed, num_threads=2, decoder_num_threads=1)
    theirs = Moonshine(unsigned, num_threads=2, decoder_num_threads=1)
    for n, question in enumerate(QUESTIONS):
        samples = _samples(question, tmp_path / str(n))
        hidden = theirs.encode(samples)
        np.testing.assert_array_equal(ours.encode(samples), hidden)
        expected, got = _split_logits(theirs, hidden), _split_logits(ours, hidden)
        assert len(got) == len(expected), question
        for step, (a, b) in enumerate(zip(expected, got, strict=True)):
            assert np.array_equal(a, b), (question, step)


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
    from stages.voice.onnx_u8 import cpu_has_vnni

    # The voice chat's threads: the encoder's pool on 2 (and the decoder's first step,
    # on every frame), the decoder's later steps on 1; none spins. Its encoder and
    # decoder: 8-bit weights, the decoder split into its steps (the defaults).
    stage = MoonshineAsr(
        "asr", cache_dir=str(converted.parent), num_threads=2, decoder_num_threads=1
    )
    # ... their weights signed where the CPU has VNNI (signed_weights: auto).
    signed = ".s8" if cpu_has_vnni() else ""
    assert stage.model.files.decoder.name == "decoder_model_merged.u8.onnx"
    assert stage.model.files.encoder.name == f"encoder_model.u8{signed}.onnx"
    assert stage.model.files.steps == (
        converted / f"decoder_model_merged.u8.first{signed}.onnx",
        converted / f"decoder_model_merged.u8.next{signed}.onnx",
    )
    assert stage.model.decoder is None
    assert stage.model.steps is not None
    first, later = stage.model.steps
    for session, threads in ((stage.model.encoder, 2), (first, 2), (later, 1)):
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
        MoonshineAsr(
            "asr", model_dir=str(tmp_path), decoder_weights="float32", encoder_weights="float32"
        )
    with pytest.raises(ValueError, match=r"decoder_weights must be one of"):
        MoonshineAsr("asr", decoder_weights="int4")
    with pytest.raises(ValueError, match=r"encoder_weights must be one of .*'int8'"):
        MoonshineAsr("asr", encoder_weights="int8")
    with pytest.raises(ValueError, match=r"signed_weights must be auto or off, not 'on'"):
        MoonshineAsr("asr", signed_weights="on")


def test_8_bit_weights_for_a_model_dir_are_refused_naming_both_params() -> None:
    from stages.voice.asr import MoonshineAsr
    from stages.voice.moonshine import packaged_model_dir

    with pytest.raises(ValueError, match=r"decoder_weights: uint8 .*model_dir"):
        MoonshineAsr("asr", model_dir=str(packaged_model_dir()))
    with pytest.raises(ValueError, match=r"encoder_weights / decoder_weights: uint8 .*model_dir"):
        MoonshineAsr("asr", model_dir=str(packaged_model_dir()), decoder_weights="float32")
