"""Qwen2.5-Omni stages on the tiny checkpoint: first audio vs generate(), rates, step anatomy.

Usage (from the repository root)::

    python benchmarks/qwen2_5_omni_stages.py [--streams 1,4,16] [--checkpoint DIR]

Per concurrency level, one fresh pipeline (configs/qwen2.5-omni-tiny.yaml, greedy
thinker and talker, fixed lengths) runs that many streams at once and reports:
time to first audio (median over streams), aggregate thinker tokens/s and talker
codes/s over the run's wall time, and the AR stages' per-step means (forward,
sampling, packaging, gap between step starts). The baseline is transformers'
monolithic ``generate(return_audio=True)`` on the same weights and prompt (median
of 3 after a warm-up): its first audio is its whole run, T. Serving N requests one
after another, its mean first audio is (N + 1) / 2 x T (computed from T, not run).
Tiny models are dominated by Python overhead (GIL held), so stage overlap on CPU
is limited; ratios from one run are what to compare, absolute times are context.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import torch
import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import omnitrio
from stages.qwen2_5_omni.prompt import build_prompt
from stages.qwen2_5_omni.tiny import make_tiny_checkpoint
from tests.qwen2_5_omni_helpers import tiny_config

# A prompt whose reply on the tiny weights runs the talker to TALKER_CODES (2.4 s of audio):
# first audio only means something when there is more than one window of it.
PROMPT = "The quick brown fox jumps over the lazy dog."
THINKER_TOKENS = 32
TALKER_CODES = 120
OPTIONS = {"thinker.max_tokens": THINKER_TOKENS, "talker.max_tokens": TALKER_CODES}


async def pipelined(checkpoint: pathlib.Path, num_streams: int) -> dict[str, float]:
    config = tiny_config(checkpoint, talker={"temperature": 0.0})
    first_audio_s: list[float] = []
    async with omnitrio.open_pipeline(config) as pipeline:
        started = time.perf_counter()

        async def one() -> None:
            request = omnitrio.Request(PROMPT, options=OPTIONS)
            opened = time.perf_counter()
            async with pipeline.open_stream(request) as stream:
                async for item in stream:
                    if isinstance(item, omnitrio.AudioChunk) and len(first_audio_s) < num_streams:
                        first_audio_s.append(time.perf_counter() - opened)
                        break
                async for _ in stream:
                    pass

        async with trio.open_nursery() as nursery:
            for _ in range(num_streams):
                nursery.start_soon(one)
        wall_s = time.perf_counter() - started
        stages = pipeline.statistics().stages
        thinker, talker = stages["thinker"].model, stages["talker"].model
        token2wav = stages["token2wav"].model
    return {
        "ttfa_s": statistics.median(first_audio_s),
        "thinker_tokens_per_s": thinker["num_tokens"] / wall_s,
        "talker_codes_per_s": talker["num_tokens"] / wall_s,
        "thinker_forward_ms": thinker["forward_ms_mean"],
        "thinker_sampling_ms": thinker["sampling_ms_mean"],
        "thinker_packaging_ms": thinker["packaging_ms_mean"],
        "thinker_gap_ms": thinker["step_gap_ms_mean"],
        "talker_forward_ms": talker["forward_ms_mean"],
        "talker_sampling_ms": talker["sampling_ms_mean"],
        "talker_packaging_ms": talker["packaging_ms_mean"],
        "talker_gap_ms": talker["step_gap_ms_mean"],
        "audio_s_per_stream": token2wav["audio_s"] / num_streams,
        "thinker_max_batch": thinker["largest_decode_batch_size"],
        "talker_max_batch": talker["largest_decode_batch_size"],
    }


def monolithic_s(checkpoint: pathlib.Path) -> float:
    from transformers import (
        AutoTokenizer,
        Qwen2_5OmniForConditionalGeneration,
        WhisperFeatureExtractor,
    )

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    features = WhisperFeatureExtractor.from_pretrained(checkpoint)
    prompt = build_prompt(omnitrio.Request(PROMPT), tokenizer, features)
    talker = model.config.talker_config
    runs_s = []
    for _ in range(4):  # the first is a warm-up
        started = time.perf_counter()
        model.generate(
            prompt.input_ids,
            thinker_max_new_tokens=THINKER_TOKENS,
            talker_max_new_tokens=TALKER_CODES,
            talker_do_sample=False,
            talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
        )
        runs_s.append(time.perf_counter() - started)
    return statistics.median(runs_s[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,4,16")
    parser.add_argument("--checkpoint", type=pathlib.Path)
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        help="sys.setswitchinterval: how long a thread holding the GIL keeps a waiting one out",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint or pathlib.Path(scratch)
        if args.checkpoint is None:
            make_tiny_checkpoint(checkpoint)
        baseline_s = monolithic_s(checkpoint)
        print(f"monolithic generate(): first audio after {baseline_s * 1e3:.0f} ms (its whole run)")
        trio.run(pipelined, checkpoint, 1)  # warm-up
        for level in (int(n) for n in args.streams.split(",")):
            result = trio.run(pipelined, checkpoint, level)
            sequential_s = (level + 1) / 2 * baseline_s
            ratio = sequential_s / result["ttfa_s"]
            print(
                f"{level} streams: TTFA {result['ttfa_s'] * 1e3:.0f} ms; sequential generate() "
                f"{sequential_s * 1e3:.0f} ms: {ratio:.1f}x"
            )
            print("  " + ", ".join(f"{k} {v:.2f}" for k, v in result.items() if k != "ttfa_s"))


if __name__ == "__main__":
    main()
