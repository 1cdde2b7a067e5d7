"""Qwen3-Omni stages versus transformers' monolithic ``generate(return_audio=True)``.

Usage (from the repository root)::

    .venv/bin/python benchmarks/qwen3_omni.py [--json FILE] [--max-tokens 32] [--max-frames 64]
        [--long-answer 128:250]

On the same tiny random-init weights (``make_tiny_checkpoint``, built into a
temporary folder) and the same prompts, greedy decoding:

1. time to first audio, one request at a time: the pipelined stages (first
   ``AudioChunk``) versus ``generate`` (audio exists only when it returns);
2. aggregate thinker tokens/s and talker frames/s at 1, 4 and 16 concurrent
   streams (continuous batching);
3. per-step critical path (forward, sampling) versus packaging time, from the
   stages' own statistics.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import trio
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

import omnitrio
from omnitrio import with_model_path
from stages.qwen3_omni.tiny import make_tiny_checkpoint

CONFIG = Path(__file__).parent.parent / "configs" / "qwen3-omni-tiny.yaml"
PROMPTS = [
    "hello there",
    "what is the capital of france?",
    "tell me a story about a dragon",
    "why is the sky blue?",
]


async def pipelined(config, requests):  # type: ignore[no-untyped-def]
    """Run ``requests`` concurrently; returns per-request TTFA, wall time, statistics."""
    ttfa: list[float] = []

    async def one(request: omnitrio.Request) -> None:
        started = time.perf_counter()
        first = None
        async with pipeline.open_stream(request) as stream:
            async for item in stream:
                if first is None and isinstance(item, omnitrio.AudioChunk):
                    first = time.perf_counter() - started
        ttfa.append(first if first is not None else float("nan"))

    async with omnitrio.open_pipeline(config) as pipeline:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for request in requests:
                nursery.start_soon(one, request)
        wall = time.perf_counter() - started
        stats = pipeline.statistics()
    return ttfa, wall, stats


def monolithic_ttfa(model, tokenizer, prompt: str, max_tokens: int, max_frames: int) -> float:  # type: ignore[no-untyped-def]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    started = time.perf_counter()
    model.generate(
        ids,
        thinker_max_new_tokens=max_tokens,
        thinker_do_sample=False,
        thinker_eos_token_id=tokenizer.eos_token_id,
        talker_do_sample=False,
        talker_max_new_tokens=max_frames,
    )
    return time.perf_counter() - started


def ttfa_side_by_side(config, model, tokenizer, tokens: int, frames: int, repeats: int):  # type: ignore[no-untyped-def]
    """Median TTFA of the stages and of generate, request by request, alternating."""
    options = {
        "temperature": 0,
        "talker.temperature": 0,
        "max_tokens": tokens,
        "talker.max_tokens": frames,
    }
    ours, theirs = [], []
    for _ in range(repeats):
        for prompt in PROMPTS:
            ttfa, _, _ = trio.run(pipelined, config, [omnitrio.Request(prompt, options=options)])
            ours += ttfa
            theirs.append(monolithic_ttfa(model, tokenizer, prompt, tokens, frames))
    return {
        "max_tokens": tokens,
        "max_frames": frames,
        "omnitrio_median_s": statistics.median(ours),
        "generate_median_s": statistics.median(theirs),
        "ratio": statistics.median(ours) / statistics.median(theirs),
        "num_requests": len(ours),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-frames", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--long-answer",
        default="128:250",
        help="TOKENS:TALKER_TOKENS of a second TTFA workload (250 frames = 20 s of speech)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {
        "temperature": 0,
        "talker.temperature": 0,
        "max_tokens": args.max_tokens,
        "talker.max_tokens": args.max_frames,
    }
    results: dict[str, object] = {"max_tokens": args.max_tokens, "max_frames": args.max_frames}
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder)
        make_tiny_checkpoint(checkpoint)
        config = with_model_path(omnitrio.load_config(CONFIG), checkpoint)
        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint).eval()
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        monolithic_ttfa(model, tokenizer, PROMPTS[0], 4, 4)  # warm-up

        long_tokens, long_frames = (int(n) for n in args.long_answer.split(":"))
        results["ttfa"] = [
            ttfa_side_by_side(config, model, tokenizer, tokens, frames, args.repeats)
            for tokens, frames in ((args.max_tokens, args.max_frames), (long_tokens, long_frames))
        ]

        throughput = {}
        for concurrency in (1, 4, 16):
            requests = [
                omnitrio.Request(PROMPTS[i % len(PROMPTS)], options=options)
                for i in range(concurrency)
            ]
            _, wall, stats = trio.run(pipelined, config, requests)
            thinker, talker = stats.stages["thinker"], stats.stages["talker"]
            throughput[concurrency] = {
                "wall_s": wall,
                "thinker_tokens_per_s": thinker.num_payloads_sent / wall,
                "talker_frames_per_s": talker.num_payloads_sent / wall,
                "thinker_mean_batch": thinker.mean_batch_size,
                "talker_mean_batch": talker.mean_batch_size,
                "thinker_steps": dict(thinker.model),
                "talker_steps": dict(talker.model),
            }
        results["throughput"] = throughput
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
