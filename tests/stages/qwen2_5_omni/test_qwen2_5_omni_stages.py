"""Qwen2.5-Omni stages: batched decode numerics, state freed on cancel, packaging off the path."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import pytest
import trio

import omnitrio
from tests.qwen2_5_omni_helpers import (  # noqa: F401
    ar_statistics,
    collect_output,
    tiny_checkpoint,
    tiny_config,
)

torch = pytest.importorskip("torch")

from transformers import DynamicCache  # noqa: E402

from omnitrio import StreamWork  # noqa: E402
from stages._torch_kv import batched_decode  # noqa: E402
from stages.qwen2_5_omni.payloads import CodecCodes  # noqa: E402
from stages.qwen2_5_omni.thinker import Qwen2_5OmniThinker  # noqa: E402
from stages.qwen2_5_omni.token2wav import Qwen2_5OmniToken2Wav  # noqa: E402

BATCHED_LOGITS_ATOL = 1e-5


@torch.no_grad()
def test_batched_decode_logits_equal_single_stream_under_teacher_forcing(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    """Four streams of different lengths, fed the same forced tokens, batched and one by one."""
    stage = Qwen2_5OmniThinker("thinker", model_path=str(tiny_checkpoint))
    model = stage.model
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (1, n), generator=generator) for n in (3, 9, 17, 30)]
    forced = torch.randint(0, 256, (len(prompts), 12), generator=generator)  # [B, steps]
    batched = [_prefilled(model, p) for p in prompts]
    single = [_prefilled(model, p) for p in prompts]
    worst = 0.0
    for step in range(forced.shape[1]):
        tokens = forced[:, step : step + 1]  # [B, 1]
        lengths = torch.tensor([c.get_seq_length() for c in batched])
        positions = lengths.view(1, -1, 1).expand(4, -1, 1)  # [4, B, 1]
        together = batched_decode(model, batched, positions, input_ids=tokens).logits[:, -1]
        for row, cache in enumerate(single):
            alone = batched_decode(
                model, [cache], positions[:, row : row + 1], input_ids=tokens[row : row + 1]
            ).logits[0, -1]
            worst = max(worst, float((alone - together[row]).abs().max()))
    stage.close()
    print(f"batched vs single-stream thinker logits: max abs difference {worst:.2e}")
    assert worst <= BATCHED_LOGITS_ATOL


def _prefilled(model: Any, prompt: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    length = prompt.shape[1]
    positions = torch.arange(length).view(1, 1, length).expand(4, 1, length)
    model(input_ids=prompt, position_ids=positions, past_key_values=cache, use_cache=True)
    return cache


async def test_cancelled_and_finished_streams_leave_no_state(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    config = tiny_config(tiny_checkpoint)
    long = omnitrio.Request("tell me a story", options={"max_tokens": 64})
    short = omnitrio.Request("hello there", options={"max_tokens": 4, "talker.max_tokens": 8})
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream(long) as cancelled:
            async for _ in cancelled:
                break  # leave after the first item: the stream is cancelled
        async with pipeline.open_stream(short) as finished:
            items = [item async for item in finished]
        assert any(isinstance(i, omnitrio.AudioChunk) for i in items)
        for name in ("thinker", "talker"):
            stats = ar_statistics(pipeline, name)
            assert stats.num_active_streams == 0, name
            assert stats.kv_bytes == 0, name
        assert pipeline.statistics().num_cancelled == 1


class SlowThinker(Qwen2_5OmniThinker):
    """Forward and packaging each take ``delay_ms`` more, slept (GIL released, like a GPU)."""

    def __init__(self, *args: Any, delay_ms: float, slow_packaging: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s = delay_ms / 1000
        self.slow_packaging = slow_packaging

    def _decode(self, sids: list[str]) -> None:
        time.sleep(self.delay_s)
        super()._decode(sids)

    def _reply_token(self, *args: Any) -> Any:
        if self.slow_packaging:
            time.sleep(self.delay_s)
        return super()._reply_token(*args)


@pytest.mark.parametrize("slow_packaging", [False, True])
async def test_slow_packaging_leaves_the_step_cadence_unchanged(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    slow_packaging: bool,
) -> None:
    """Packaging as slow as the forward overlaps it: steps start one forward apart, not two."""
    delay_ms = 40.0
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "slow", "client_capacity": 64},
            "stages": [
                {
                    "name": "thinker",
                    "impl": f"{__name__}:SlowThinker",
                    "params": {
                        "model_path": str(tiny_checkpoint),
                        "delay_ms": delay_ms,
                        "slow_packaging": slow_packaging,
                        "max_tokens": 16,
                    },
                },
                {
                    "name": "sink",  # takes the talker-bound payloads, emits nothing
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"inputs_per_step": 64, "outputs_per_input": 0, "visible_every": 0},
                },
            ],
            "edges": [{"from": "thinker", "to": "sink", "capacity": 64}],
        }
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("tell me a story") as stream:
            [item async for item in stream]
        stats = ar_statistics(pipeline, "thinker")
    if slow_packaging:  # every job but the prefill's sleeps
        assert stats.packaging_mean_s >= 0.5 * delay_ms / 1000
    # Serial packaging would put the gap at two delays; overlapped it stays near one.
    assert stats.step_gap_mean_s < 1.5 * delay_ms / 1000
    print(
        f"slow_packaging={slow_packaging}: step gap {stats.step_gap_mean_s * 1000:.1f} ms, "
        f"forward {stats.forward_mean_s * 1000:.1f} ms, "
        f"packaging {stats.packaging_mean_s * 1000:.1f} ms"
    )


def test_token2wav_sends_a_smaller_first_window_then_full_windows(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    stage = Qwen2_5OmniToken2Wav(
        "token2wav",
        model_path=str(tiny_checkpoint),
        first_chunk_frames=6,
        chunk_frames=12,
        left_context_frames=12,
        right_context_frames=6,
    )
    stage.open_stream("s", omnitrio.Request("x"))
    codes = CodecCodes(tuple(range(30)))
    first = stage.step([StreamWork("s", (codes,), False)])["s"]
    rest = stage.step([StreamWork("s", (), True)])["s"]
    stage.close_stream("s")
    stage.close()
    samples_per_code = 2 * 240  # DiT repeats x BigVGAN upsampling
    # Open input: 30 codes cover windows [0, 6) and [6, 18) with 6 codes of lookahead;
    # [18, 30) needs 6 more or the end of input.
    assert [len(c.pcm16) // 2 for c in first.visible] == [
        6 * samples_per_code,
        12 * samples_per_code,
    ]
    assert first.more is False
    assert first.done is False
    assert [len(c.pcm16) // 2 for c in rest.visible] == [12 * samples_per_code]
    assert rest.done is True
    assert {c.sample_rate_hz for c in (*first.visible, *rest.visible)} == {24000}


@pytest.mark.parametrize(
    ("request_", "problem", "stages"),
    [
        (
            omnitrio.Request("hi", audio=omnitrio.AudioInput(b"\0\0" * 800, 8000)),
            "16000 Hz",
            {"thinker"},
        ),
        # Stages open a new stream concurrently: whichever reads the option first fails it.
        (
            omnitrio.Request("hi", options={"speaker": "Nobody"}),
            "unknown speaker",
            {"thinker", "token2wav"},
        ),
        (
            omnitrio.Request("hi", options={"top_p": 2.0}),
            "option 'top_p' .* must be in",
            {"thinker", "talker"},
        ),
    ],
)
async def test_bad_input_fails_its_stream_with_a_clear_error_and_others_go_on(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    request_: omnitrio.Request,
    problem: str,
    stages: set[str],
) -> None:
    config = tiny_config(tiny_checkpoint)
    good = omnitrio.Request("hello there", options={"max_tokens": 3, "talker.max_tokens": 6})
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream(request_) as bad:
            with pytest.raises(omnitrio.StageError, match=problem) as failure:
                [item async for item in bad]
        async with pipeline.open_stream(good) as stream:
            items = [item async for item in stream]
    assert failure.value.stage in stages
    assert any(isinstance(i, omnitrio.AudioChunk) for i in items)


async def test_sampling_with_a_seed_reproduces(tiny_checkpoint: pathlib.Path) -> None:  # noqa: F811
    """Per-stream generators: the same seed gives the same text and codes, alone or not."""
    config = tiny_config(tiny_checkpoint, thinker={"emit_ids": True}, talker={"emit_codes": True})
    options = {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 7, "max_tokens": 12}
    sampled = omnitrio.Request("tell me a story", options={**options, "talker.max_tokens": 30})
    other = omnitrio.Request("hello there", options={"max_tokens": 8, "talker.max_tokens": 30})
    runs = []
    async with omnitrio.open_pipeline(config) as pipeline:
        for company in ((), (other,)):
            async with trio.open_nursery() as nursery:
                for request in company:
                    nursery.start_soon(_drain, pipeline, request)
                async with pipeline.open_stream(sampled) as stream:
                    runs.append(collect_output([item async for item in stream]))
    assert runs[0].text_ids == runs[1].text_ids
    assert runs[0].codes == runs[1].codes
    assert len(runs[0].text_ids) > 0


async def _drain(pipeline: omnitrio.Pipeline, request: omnitrio.Request) -> None:
    async with pipeline.open_stream(request) as stream:
        async for _ in stream:
            pass
