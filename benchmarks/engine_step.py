"""One decode step of the tiny Qwen3-Omni thinker, per engine, batch and context.

Usage (from the repository root)::

    python benchmarks/engine_step.py --engines torch,torch-gather,vllm \\
        --batch 1,8,32 --context 64,1024 [--new-tokens 32] [--json FILE]

The thinker of ``make_tiny_checkpoint`` (fp32, CPU, one thread), ``batch`` streams
with ``context`` prompt tokens each (different random byte tokens per stream),
greedy, ``new-tokens`` decode steps after the prefills. A row per engine, batch
and context: the median milliseconds of one decode step over the steps (all
streams one token), tokens per second (batch / median step), and how many
streams' greedy tokens equal the ``torch`` engine's.

- ``torch``: the stage's path, one batched forward over the stage's KV slots
  (``stages.kit.KVSlots``: each stream's rows written in place, no gather).
- ``torch-gather``: the path before it (``stages.kit.batched_decode``: per-stream
  ``DynamicCache``s gathered into a left-padded batch every step, then scattered).
- ``vllm``: vLLM's ``LLMEngine`` (engine core in-process), one ``step()`` a token,
  through ``stages.kit.VllmEngine``, the vLLM thinker stage's engine.
- ``vllm-compiled``: the same with ``compiled=True`` (vLLM's torch.compile path; on a
  CPU one Dynamo trace and inductor kernels), as param ``vllm_compile`` starts the voice
  LLM's engine. Its start (a minute's compile the first time) is not in the step.

``--pipeline 1,8,32``: then the tiny Qwen3-Omni pipeline (thinker -> talker ->
code2wav) at that many concurrent streams, once per config: the thinker on torch
(configs/qwen3-omni-tiny.yaml) and on vLLM (configs/qwen3-omni-tiny-vllm.yaml);
greedy, ``--new-tokens`` answer tokens, 64 talker frames. Rows: time to first audio
(p50, p99 over streams) and answer text bytes per second (the tiny byte tokenizer:
about one byte a token) over the run's wall time, and how many streams admission
shed to keep the others in real time (their first audio, if any came, is counted);
then where the time went: CPU seconds of this process and of the engine process
during the streams, and
per stage its steps, mean batch, busy / trio / idle seconds and its own step figures
(for the vLLM thinker: the stage's wait per engine step, the engine's ``step()`` and,
of it, the model's forward).
``--context ""`` skips the decode steps. ``--max-batch-size N``: every pipeline stage's
``max_batch_size`` instead of the config's.

Engines run one after another on the same prompts; the figures compare within a run.
``--repeats N``: N runs per row, the engines alternating, each row the median of its
runs' medians (the range beside it): on a shared machine the load drifts between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from stages.kit import KVSlots, batched_decode
from stages.qwen3_omni.tiny import make_tiny_checkpoint

Prompts = list[list[int]]
Run = Callable[[Prompts, int], tuple[list[float], list[list[int]]]]


def _thinker(checkpoint: pathlib.Path) -> Any:
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    return Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
        checkpoint / "thinker", dtype=torch.float32
    ).eval()


def _prefill(model: Any, prompt: list[int]) -> tuple[Any, int]:
    from transformers import DynamicCache

    ids = torch.tensor([prompt])
    positions = torch.arange(len(prompt)).view(1, 1, -1).expand(4, 1, -1)
    cache = DynamicCache()
    out = model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
    return cache, int(out.logits[0, -1].argmax())


@torch.no_grad()
def run_torch(
    model: Any, prompts: Prompts, steps: int, *, gather: bool
) -> tuple[list[float], list[list[int]]]:
    pool = KVSlots()
    caches, tokens = [], []
    for prompt in prompts:
        cache, token = _prefill(model, prompt)
        caches.append(cache if gather else pool.adopt(cache))
        tokens.append([token])
    times = []
    for _ in range(steps):
        last = torch.tensor([[t[-1]] for t in tokens])
        positions = torch.tensor([int(c.get_seq_length()) for c in caches]).view(1, -1, 1)
        started = time.perf_counter()
        if gather:
            logits = batched_decode(model, caches, positions, input_ids=last).logits[:, -1]
        else:
            out, rows = pool.decode(model, caches, positions, input_ids=last)
            logits = out.logits[rows, -1]
        picked = logits.argmax(-1).tolist()
        times.append(time.perf_counter() - started)
        for row, token in enumerate(picked):
            tokens[row].append(token)
    return times, tokens


class VllmRuns:
    """One engine for every batch and context of the run (a start takes seconds)."""

    def __init__(self, checkpoint: pathlib.Path, max_num_seqs: int, compiled: bool) -> None:
        self.checkpoint, self.max_num_seqs, self.compiled = checkpoint, max_num_seqs, compiled
        self.engine: Any = None
        self.runs = 0

    def __call__(self, prompts: Prompts, steps: int) -> tuple[list[float], list[list[int]]]:
        from stages.kit import VllmEngine

        if self.engine is None:
            self.engine = VllmEngine.start(
                str(self.checkpoint), max_num_seqs=self.max_num_seqs, compiled=self.compiled
            )
            print(f"vLLM (compiled={self.compiled}) started in {self.engine.start_s:.1f} s")
        engine, self.runs = self.engine, self.runs + 1
        ids = [f"{self.runs}-{i}" for i in range(len(prompts))]
        for request_id, prompt in zip(ids, prompts, strict=True):
            engine.add(request_id, prompt, max_tokens=steps + 1, ignore_eos=True)
        tokens: dict[str, list[int]] = {request_id: [] for request_id in ids}
        times = []
        while any(len(t) < steps + 1 for t in tokens.values()):
            decode_only = all(len(t) > 0 for t in tokens.values())
            started = time.perf_counter()
            outputs = engine.step()
            elapsed = time.perf_counter() - started
            for out in outputs:
                tokens[out.request_id].extend(out.new_token_ids)
            if decode_only:
                times.append(elapsed)  # a step in which every stream decodes one token
        return times, [tokens[request_id] for request_id in ids]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


PIPELINE_CONFIGS = {"torch": "qwen3-omni-tiny.yaml", "vllm": "qwen3-omni-tiny-vllm.yaml"}
PIPELINE_FRAMES = 64


async def _pipeline_run(config: Any, num_streams: int, tokens: int) -> dict[str, float]:
    import trio

    import omnitrio

    options = {
        "temperature": 0,
        "talker.temperature": 0,
        "max_tokens": tokens,
        "talker.max_tokens": PIPELINE_FRAMES,
    }
    firsts: list[float] = []
    text_bytes = shed = 0

    async def one(index: int) -> None:
        nonlocal text_bytes
        request = omnitrio.Request(f"stream {index}: tell me about the sea", options=options)
        nonlocal shed
        started, first = time.perf_counter(), None
        try:
            async with pipeline.open_stream(request) as stream:
                async for item in stream:
                    if first is None and isinstance(item, omnitrio.AudioChunk):
                        first = time.perf_counter() - started
                    elif isinstance(item, omnitrio.TextDelta):
                        text_bytes += len(item.text.encode())
        except omnitrio.StreamShed:
            shed += 1  # admission stopped it to keep the others in real time
        if first is not None:
            firsts.append(first)

    async with omnitrio.open_pipeline(config) as pipeline:
        started, cpu_s, engine_cpu_s = time.perf_counter(), _cpu_s(), _engine_cpu_s()
        async with trio.open_nursery() as nursery:
            for index in range(num_streams):
                nursery.start_soon(one, index)
        wall = time.perf_counter() - started
        cpu_s, engine_cpu_s = _cpu_s() - cpu_s, _engine_cpu_s() - engine_cpu_s
        stages = _stage_profile(pipeline.statistics())
    firsts.sort()
    return {
        "ttfa_p50_s": round(statistics.median(firsts), 4),
        "ttfa_p99_s": round(firsts[min(len(firsts) - 1, int(0.99 * len(firsts)))], 4),
        "text_bytes_per_s": round(text_bytes / wall, 1),
        "wall_s": round(wall, 3),
        "streams_shed": shed,
        # CPU seconds during the streams: this process (the runtime, the torch stages)
        # and the vLLM engine processes
        "cpu_s": round(cpu_s, 2),
        "engine_cpu_s": round(engine_cpu_s, 2),
        "stages": stages,
    }


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _engine_cpu_s() -> float:
    """User + system CPU seconds of this process's vLLM engine children (from /proc)."""
    total = 0.0
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if b"_vllm_worker.py" not in (entry / "cmdline").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue  # not a process, or ended meanwhile
        if int(fields[1]) == os.getpid():
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


PROFILED = (  # a stage's own figures kept in the profile, where it reports them
    "forward_ms_mean",
    "packaging_ms_mean",
    "engine_step_ms_mean",
    "engine_core_step_ms_mean",
    "engine_forward_ms_mean",
)


def _stage_profile(stats: Any) -> dict[str, dict[str, float]]:
    """Per stage: steps, mean batch, the worker's time in stage calls (busy), the trio
    thread's for it, idle time, and the stage's own step figures."""
    return {
        name: {
            "steps": stage.num_steps,
            "mean_batch": round(stage.mean_batch_size, 2),
            "busy_s": round(stage.busy_s, 3),
            "trio_s": round(stage.trio_s, 3),
            "idle_s": round(stage.idle_s, 3),
            **{k: round(float(stage.model[k]), 3) for k in PROFILED if k in stage.model},
        }
        for name, stage in stats.stages.items()
    }


def run_pipelines(
    checkpoint: pathlib.Path,
    engines: list[str],
    streams: list[int],
    tokens: int,
    max_batch_size: int | None = None,
) -> list[dict[str, Any]]:
    import trio

    import omnitrio

    rows = []
    configs = pathlib.Path(__file__).resolve().parent.parent / "configs"
    for engine in engines:
        config = omnitrio.with_model_path(
            omnitrio.load_config(configs / PIPELINE_CONFIGS[engine]), checkpoint
        )
        if max_batch_size is not None:  # every stage's, in place of the config's
            stages = [
                s.model_copy(update={"max_batch_size": max_batch_size}) for s in config.stages
            ]
            config = config.model_copy(update={"stages": tuple(stages)})
        for num_streams in streams:
            row = {"engine": engine, "streams": num_streams, "max_batch_size": max_batch_size}
            row.update(trio.run(_pipeline_run, config, num_streams, tokens))
            rows.append(row)
            print("pipeline", json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="torch,torch-gather")
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--context", default="64,1024")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--checkpoint", type=pathlib.Path, default=None)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--pipeline", default="", help="stream counts, e.g. 1,8,32")
    parser.add_argument(
        "--max-batch-size", type=int, default=None, help="every pipeline stage's (the config's)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per row, engines alternating: the median"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint or pathlib.Path(scratch)
        if args.checkpoint is None:
            make_tiny_checkpoint(checkpoint)
        model = _thinker(checkpoint)
        batches = [int(b) for b in args.batch.split(",") if b] or [1]
        vllm = VllmRuns(checkpoint, max(batches), compiled=False)
        vllm_compiled = VllmRuns(checkpoint, max(batches), compiled=True)
        runs: dict[str, Run] = {
            "torch": lambda p, s: run_torch(model, p, s, gather=False),
            "torch-gather": lambda p, s: run_torch(model, p, s, gather=True),
            "vllm": vllm,
            "vllm-compiled": vllm_compiled,
        }
        rows = []
        generator = torch.Generator().manual_seed(0)
        print(f"{'engine':<13}{'batch':>6}{'context':>8}{'ms/step':>9}{'tok/s':>9}  equal")
        for context in (int(c) for c in args.context.split(",") if c):
            for batch in batches:
                prompts = torch.randint(0, 256, (batch, context), generator=generator).tolist()
                reference: list[list[int]] | None = None
                medians: dict[str, list[float]] = {engine: [] for engine in engines}
                equals: dict[str, int | None] = {}
                for _ in range(args.repeats):  # engines alternate: load drifts hit all alike
                    for engine in engines:
                        times, tokens = runs[engine](prompts, args.new_tokens)
                        tokens = [t[: args.new_tokens + 1] for t in tokens]
                        if engine == "torch":
                            reference = tokens
                        equal = None
                        if reference is not None:
                            equal = sum(a == b for a, b in zip(tokens, reference, strict=True))
                        equals[engine] = equal if equals.get(engine, equal) == equal else None
                        medians[engine].append(statistics.median(times) * 1e3)
                for engine in engines:
                    median_ms, equal = statistics.median(medians[engine]), equals[engine]
                    row = {
                        "engine": engine,
                        "batch": batch,
                        "context": context,
                        "median_ms_per_step": round(median_ms, 3),
                        "tokens_per_s": round(batch / median_ms * 1e3, 1),
                        "tokens_equal_torch": equal,
                        "steps_timed": len(times),
                        "run_medians_ms": [round(m, 3) for m in medians[engine]],
                    }
                    rows.append(row)
                    print(
                        f"{engine:<13}{batch:>6}{context:>8}{median_ms:>9.2f}"
                        f"{row['tokens_per_s']:>9.1f}  {equal}/{batch}"
                        f"  runs {min(medians[engine]):.2f}-{max(medians[engine]):.2f}",
                        flush=True,
                    )
        vllm.close()
        vllm_compiled.close()
        pipeline_rows = []
        if args.pipeline:
            streams = [int(n) for n in args.pipeline.split(",")]
            pipeline_engines = [e for e in engines if e in PIPELINE_CONFIGS]
            pipeline_rows = run_pipelines(
                checkpoint, pipeline_engines, streams, args.new_tokens, args.max_batch_size
            )
    if args.json is not None:
        result = {"decode_steps": rows, "pipeline": pipeline_rows}
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
