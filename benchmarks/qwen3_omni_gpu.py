"""Qwen3-Omni on one device: the pipelined stages versus transformers' ``generate``.

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.qwen3_omni_gpu [--model full-size|tiny] [--device cuda]
        [--streams 1,2,8,32] [--fast-paths off,cuda-graphs] [--max-tokens 64]
        [--max-frames 128] [--json FILE]

One model with random weights is built straight on the device (``--model
full-size``: the Qwen3-Omni-30B-A3B architecture in bf16, ~70 GB; ``tiny``: the
test model in float32) and registered in memory; the pipeline
(``configs/qwen3-omni-gpu.yaml``, its stages reading that model: ``live_model``)
and ``generate(return_audio=True)`` run on the very same weights, in the same
run, greedy, on the same prompts. For each stream count, every request is sent at
once: the pipeline serves them concurrently (continuous batching); ``generate``
serves one request at a time (it cannot batch audio), so request k waits for the
k before it, and its text and audio all arrive when it returns.

Reported per target and stream count (``benchmarks.harness`` metrics): TTFT, TTFA,
audio RTF (time to the end over seconds of audio), continuity (share of requests
whose worst underrun is <= 100 ms), and the pipeline/generate TTFA ratio. Each
``--fast-paths`` entry is a separate pipeline run (``decode_fast_path`` of the
thinker and talker: ``off``, ``compile``, ``cuda-graphs``), side by side.

Random weights speak noise and answer at random lengths; ``max_tokens`` and
``talker.max_tokens`` cap both targets alike. On CPU with ``--model tiny`` the
figures are a smoke test of the script, nothing more.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import trio

import omnitrio
from benchmarks.harness import AudioArrival, RequestRecord, aggregate
from stages.qwen3_omni import full_size, tiny
from stages.qwen3_omni.reference import SAMPLE_RATE_HZ, ReferenceGenerate
from stages.qwen3_omni.weights import LiveModel, register_live_model, unregister_live_model

CONFIG = Path(__file__).parent.parent / "configs" / "qwen3-omni-gpu.yaml"
LIVE_NAME = "benchmark"
PROMPTS = (
    "hello there",
    "what is the capital of france?",
    "tell me a story about a dragon",
    "why is the sky blue?",
)


def build_live_model(model: str, device: str) -> LiveModel:
    """Random weights initialised on ``device``, with a tokenizer and feature extractor."""
    if model == "full-size":
        weights = full_size.random_model(device, dtype=torch.bfloat16)
        tokenizer = full_size.build_tokenizer()
    else:
        weights = full_size.random_model(device, dtype=torch.float32, config=tiny.tiny_config())
        tokenizer = tiny.build_tokenizer()
    return LiveModel(weights, tokenizer, tiny.build_feature_extractor())


def pipeline_config(device: str, fast_path: str, max_streams: int) -> omnitrio.PipelineConfig:
    """configs/qwen3-omni-gpu.yaml on ``device``, its stages reading the live model."""
    config = omnitrio.load_config(CONFIG)
    stages = []
    for spec in config.stages:
        params = {k: v for k, v in spec.params.items() if k != "model_path"}
        params["live_model"] = LIVE_NAME
        if "decode_fast_path" in params:
            params["decode_fast_path"] = fast_path
        batch = max(spec.max_batch_size, max_streams)
        update = {"device": device, "params": params, "max_batch_size": batch}
        stages.append(spec.model_copy(update=update))
    # Admission by count: the benchmark measures N concurrent streams, and headroom
    # admission refuses a stream the device cannot serve in real time (the tiny model
    # on a busy CPU): that would drop the measurement, not make it.
    limits = config.pipeline.model_copy(
        update={"max_streams": max_streams, "admission": "max_streams"}
    )
    return config.model_copy(update={"stages": tuple(stages), "pipeline": limits})


@asynccontextmanager
async def full_size_pipeline(
    device: str, fast_path: str = "off", max_streams: int = 32
) -> AsyncIterator[tuple[omnitrio.Pipeline, LiveModel]]:
    """The full-size random-init model on ``device``, served by the pipeline."""
    live = build_live_model("full-size", device)
    register_live_model(LIVE_NAME, live)
    try:
        async with omnitrio.open_pipeline(pipeline_config(device, fast_path, max_streams)) as p:
            yield p, live
    finally:
        unregister_live_model(LIVE_NAME)


def requests(num: int, options: dict[str, Any]) -> list[omnitrio.Request]:
    return [omnitrio.Request(PROMPTS[i % len(PROMPTS)], options=options) for i in range(num)]


async def run_pipeline(
    pipeline: omnitrio.Pipeline, batch: Sequence[omnitrio.Request]
) -> list[RequestRecord]:
    """All of ``batch`` at once; one timeline per request."""
    records: dict[int, RequestRecord] = {}
    started = time.perf_counter()

    async def one(index: int, request: omnitrio.Request) -> None:
        text: list[float] = []
        audio: list[AudioArrival] = []
        async with pipeline.open_stream(request) as stream:
            async for item in stream:
                now = time.perf_counter() - started
                if isinstance(item, omnitrio.TextDelta):
                    text.append(now)
                elif isinstance(item, omnitrio.AudioChunk):
                    audio.append(AudioArrival(now, item.duration_s))
        records[index] = RequestRecord(
            index, 0, 0.0, "completed", tuple(text), tuple(audio), time.perf_counter() - started
        )

    async with trio.open_nursery() as nursery:
        for index, request in enumerate(batch):
            nursery.start_soon(one, index, request)
    return [records[i] for i in range(len(batch))]


def run_generate(
    reference: ReferenceGenerate, batch: Sequence[omnitrio.Request]
) -> list[RequestRecord]:
    """One request after another, all sent at time 0: everything arrives when it returns."""
    records = []
    started = time.perf_counter()
    for index, request in enumerate(batch):
        items = reference(request)
        done = time.perf_counter() - started
        text = tuple(done for item in items if isinstance(item, omnitrio.TextDelta))
        audio = tuple(
            AudioArrival(done, item.duration_s)
            for item in items
            if isinstance(item, omnitrio.AudioChunk)
        )
        records.append(RequestRecord(index, 0, 0.0, "completed", text, audio, done))
    return records


def summary(records: list[RequestRecord]) -> dict[str, Any]:
    result, _ = aggregate(records)
    pick = {
        "ttft_s": result.ttft_s,
        "ttfa_s": result.ttfa_s,
        "audio_rtf": result.audio_rtf,
        "e2el_s": result.e2el_s,
    }
    out: dict[str, Any] = {k: None if v is None else asdict(v) for k, v in pick.items()}
    out["continuity_rate"] = result.continuity_rate
    out["num_completed"] = result.num_completed
    out["audio_s_per_s"] = result.throughput.audio_s_per_s
    return out


def p50(summary: dict[str, Any], key: str) -> float | None:
    value = summary.get(key)
    return None if value is None else float(value["median"])


def print_row(streams: int, target: str, s: dict[str, Any], ratio: float | None) -> None:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:8.3f}"

    continuity = s["continuity_rate"]
    print(
        f"{streams:>7} {target:<24} {fmt(p50(s, 'ttft_s'))} {fmt(p50(s, 'ttfa_s'))} "
        f"{fmt(None if s['ttfa_s'] is None else s['ttfa_s']['p90'])} {fmt(p50(s, 'audio_rtf'))} "
        f"{'-' if continuity is None else f'{continuity:8.2f}'} {fmt(ratio)}"
    )


async def measure(args: argparse.Namespace, live: LiveModel) -> dict[str, Any]:
    options = {
        "temperature": 0,
        "talker.temperature": 0,
        "max_tokens": args.max_tokens,
        "talker.max_tokens": args.max_frames,
    }
    reference = ReferenceGenerate(live.model, live.tokenizer)
    results: dict[str, Any] = {}
    generate: dict[int, dict[str, Any]] = {}
    for streams in args.streams:
        run_generate(reference, requests(1, options))  # warm-up
        generate[streams] = summary(run_generate(reference, requests(streams, options)))
    results["generate"] = generate
    for fast_path in args.fast_paths:
        config = pipeline_config(args.device, fast_path, max(args.streams))
        per_streams: dict[int, dict[str, Any]] = {}
        async with omnitrio.open_pipeline(config) as pipeline:
            for streams in args.streams:
                await run_pipeline(pipeline, requests(streams, options))  # warm-up: shapes
                per_streams[streams] = summary(
                    await run_pipeline(pipeline, requests(streams, options))
                )
        results[f"pipeline[{fast_path}]"] = per_streams
    return results


def report(results: dict[str, Any], streams: Sequence[int]) -> None:
    print(
        f"{'streams':>7} {'target':<24} {'TTFT p50':>8} {'TTFA p50':>8} {'TTFA p90':>8} "
        f"{'RTF p50':>8} {'contin.':>8} {'TTFA/gen':>8}"
    )
    for n in streams:
        generate_ttfa = p50(results["generate"][n], "ttfa_s")
        for target, per_streams in results.items():
            ttfa = p50(per_streams[n], "ttfa_s")
            ratio = None if ttfa is None or not generate_ttfa else ttfa / generate_ttfa
            print_row(n, target, per_streams[n], ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("full-size", "tiny"), default="full-size")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--streams", default="1,2,8,32")
    parser.add_argument(
        "--fast-paths",
        default="off",
        help="comma-separated decode_fast_path values, one pipeline run each (off,cuda-graphs)",
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-frames", type=int, default=128)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.model == "full-size" and not args.device.startswith("cuda"):
        parser.error(
            f"--model full-size needs ~70.5 GB of bf16 weights on a GPU, not {args.device}; "
            "on a CPU run --model tiny (a smoke test of the script)"
        )
    args.streams = [int(n) for n in args.streams.split(",")]
    args.fast_paths = args.fast_paths.split(",")
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    built = time.perf_counter()
    live = build_live_model(args.model, args.device)
    build_s = time.perf_counter() - built
    register_live_model(LIVE_NAME, live)
    try:
        results = trio.run(measure, args, live)
    finally:
        unregister_live_model(LIVE_NAME)
    device_name = (
        torch.cuda.get_device_name(torch.device(args.device))
        if args.device.startswith("cuda")
        else "cpu"
    )
    meta = {
        "model": args.model,
        "device": args.device,
        "device_name": device_name,
        "parameters": sum(p.numel() for p in live.model.parameters()),
        "build_s": build_s,
        "max_tokens": args.max_tokens,
        "max_frames": args.max_frames,
        "sample_rate_hz": SAMPLE_RATE_HZ,
    }
    print(json.dumps(meta))
    report(results, args.streams)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
