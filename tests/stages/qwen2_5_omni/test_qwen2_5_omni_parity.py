"""Design invariant 7 for Qwen2.5-Omni: the pipelined stages equal transformers' generate().

Greedy thinker and talker, fixed noise seed. Text ids and codec codes must be
identical; the waveform is identical when token2wav decodes the utterance as one
window, and within ``CHUNKED_MAX_ABS``/``CHUNKED_RMS`` of full scale when it decodes
windows with left and right context (the DiT's attention reaches across window
edges, so a windowed decode is not bit-exact; see stages/qwen2_5_omni/token2wav.py).
"""

from __future__ import annotations

import math
import pathlib

import pytest
import trio

import omnitrio
from tests.qwen2_5_omni_helpers import (
    ARStageStatistics,
    Output,
    Reference,
    ar_statistics,
    collect_output,
    pcm_difference,
    tiny_checkpoint,  # noqa: F401 - a fixture
    tiny_config,
)

torch = pytest.importorskip("torch")


WHOLE = {"first_chunk_frames": 4096, "chunk_frames": 4096, "left_context_frames": 0}
CHUNKED = {
    "first_chunk_frames": 12,
    "chunk_frames": 24,
    "left_context_frames": 24,
    "right_context_frames": 12,
}
# Measured on the tiny checkpoint (signal RMS ~0.09 of full scale): max abs ~0.02, RMS
# ~3e-4 with these windows; without right context (lookahead) max abs ~0.29, RMS ~0.018.
CHUNKED_MAX_ABS = 0.05
CHUNKED_RMS = 0.002

PROMPTS = (
    "hello there",
    "a",
    "what is the weather like",
    "tell me a story",
    "xyz",
    "The quick brown fox jumps over the lazy dog.",
    "ok",
    "Wie geht es dir heute?",
)


def _sine_pcm16(seconds: float, sample_rate_hz: int = 16000) -> bytes:
    samples = (
        int(8000 * math.sin(2 * math.pi * 440 * i / sample_rate_hz))
        for i in range(int(seconds * sample_rate_hz))
    )
    return b"".join(s.to_bytes(2, "little", signed=True) for s in samples)


def _requests() -> list[tuple[omnitrio.Request, int, int, int]]:
    """(request, thinker max tokens, talker max tokens, seed) for 8 different streams."""
    out = []
    for index, prompt in enumerate(PROMPTS):
        thinker_max, talker_max, seed = 4 + 2 * index, 20 + 5 * index, index
        audio = omnitrio.AudioInput(_sine_pcm16(0.5 + 0.25 * index), 16000) if index == 3 else None
        options = {
            "thinker.max_tokens": thinker_max,
            "talker.max_tokens": talker_max,
            "talker.temperature": 0.0,
            "seed": seed,
        }
        out.append(
            (
                omnitrio.Request(prompt, audio=audio, options=options),
                *(thinker_max, talker_max, seed),
            )
        )
    return out


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: pathlib.Path) -> Reference:  # noqa: F811
    return Reference(tiny_checkpoint)


async def _run(
    config: omnitrio.PipelineConfig, requests: list[omnitrio.Request]
) -> tuple[list[Output], dict[str, ARStageStatistics]]:
    """The requests as concurrent streams, each opened when the one before has sent its
    first item (so streams join while others decode); outputs and the AR stages' stats."""
    results: dict[int, Output] = {}
    started = [trio.Event() for _ in requests]
    async with omnitrio.open_pipeline(config) as pipeline:

        async def one(index: int, request: omnitrio.Request) -> None:
            if index:
                await started[index - 1].wait()
            items = []
            async with pipeline.open_stream(request) as stream:
                async for item in stream:
                    items.append(item)
                    started[index].set()
            started[index].set()
            results[index] = collect_output(items)

        async with trio.open_nursery() as nursery:
            for index, request in enumerate(requests):
                nursery.start_soon(one, index, request)
        stats = {name: ar_statistics(pipeline, name) for name in ("thinker", "talker")}
    return [results[i] for i in range(len(requests))], stats


def _config(
    checkpoint: pathlib.Path, token2wav: dict[str, int], device: str = "cpu"
) -> omnitrio.PipelineConfig:
    return tiny_config(
        checkpoint,
        device,
        thinker={"emit_ids": True},
        talker={"emit_codes": True},
        token2wav=token2wav,
    )


async def test_one_stream_equals_generate_exactly_when_decoded_whole(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    reference: Reference,
) -> None:
    request, thinker_max, talker_max, seed = _requests()[0]
    [got], _ = await _run(_config(tiny_checkpoint, WHOLE), [request])
    want = reference.run(
        request, thinker_max_tokens=thinker_max, talker_max_tokens=talker_max, seed=seed
    )
    assert got.text_ids == want.text_ids
    assert got.text == want.text
    assert got.codes == want.codes
    assert len(got.codes) > 0
    assert got.pcm16 == want.pcm16
    assert got.sample_rates_hz == {24000}


async def test_eight_concurrent_streams_each_equal_generate(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    reference: Reference,
) -> None:
    cases = _requests()
    got, stats = await _run(_config(tiny_checkpoint, CHUNKED), [c[0] for c in cases])
    assert stats["thinker"].largest_batch_size > 1  # decode steps really were batched
    assert stats["talker"].largest_batch_size > 1
    worst_abs = worst_rms = 0.0
    for (request, thinker_max, talker_max, seed), output in zip(cases, got, strict=True):
        want = reference.run(
            request, thinker_max_tokens=thinker_max, talker_max_tokens=talker_max, seed=seed
        )
        assert output.text_ids == want.text_ids, request.text
        assert output.text == want.text
        assert output.codes == want.codes, request.text
        max_abs, rms = pcm_difference(output.pcm16, want.pcm16)
        worst_abs, worst_rms = max(worst_abs, max_abs), max(worst_rms, rms)
    print(f"chunked waveform vs reference: max abs {worst_abs:.4f}, rms {worst_rms:.5f}")
    assert worst_abs <= CHUNKED_MAX_ABS
    assert worst_rms <= CHUNKED_RMS


async def test_a_talker_that_ends_before_the_thinker_still_equals_generate(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    reference: Reference,
) -> None:
    """The talker reaches its code budget while the thinker is still writing."""
    options = {"max_tokens": 40, "talker.max_tokens": 3, "talker.temperature": 0.0}
    request = omnitrio.Request("tell me a story", options=options)
    [got], _ = await _run(_config(tiny_checkpoint, CHUNKED), [request])
    want = reference.run(request, thinker_max_tokens=40, talker_max_tokens=3, seed=0)
    assert len(got.text_ids) > len(got.codes)
    assert (got.text_ids, got.text, got.codes) == (want.text_ids, want.text, want.codes)
    assert got.pcm16 == want.pcm16  # 3 codes: one window


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)
async def test_eight_concurrent_streams_on_cuda_equal_generate_on_cuda(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    """Every stage on the GPU: text ids and codec codes equal generate's on the GPU (the
    waveform's noise is drawn on the host by the stage, on the GPU by generate: checked
    for length and finiteness only)."""
    reference = Reference(tiny_checkpoint, "cuda")
    cases = _requests()
    got, _ = await _run(_config(tiny_checkpoint, CHUNKED, "cuda"), [c[0] for c in cases])
    for (request, thinker_max, talker_max, seed), output in zip(cases, got, strict=True):
        want = reference.run(
            request, thinker_max_tokens=thinker_max, talker_max_tokens=talker_max, seed=seed
        )
        assert output.text_ids == want.text_ids, request.text
        assert output.codes == want.codes, request.text
        assert len(output.pcm16) == len(want.pcm16), request.text
