"""The Python API in one page: a three-stage pipeline built in code, two streams.

Run it from the repository root::

    .venv/bin/python examples/python_api.py

The stages are ``SyntheticStage`` fakes shaped like an omni model (thinker ->
talker -> code2wav) with a 1 ms step, so the whole run takes a few tens of
milliseconds. One stream is read to the end with ``async for``; the other is
cancelled early simply by leaving its ``async with`` block.
"""

from __future__ import annotations

import trio

import omnitrio

SYNTHETIC = "stages.synthetic:SyntheticStage"

CONFIG = omnitrio.parse_config(
    {
        "pipeline": {"name": "example", "max_streams": 4},
        "stages": [
            {
                "name": "thinker",
                "impl": SYNTHETIC,
                # 12 tokens per answer, a text delta per token, a 1 KiB "hidden state" payload.
                "params": {"steps": 12, "payload_bytes": 1024, "service_time_ms": 1.0},
            },
            {
                "name": "talker",
                "impl": SYNTHETIC,
                # One codec frame per token; nothing user-visible.
                "params": {"visible_every": 0, "service_time_ms": 1.0},
            },
            {
                "name": "code2wav",
                "impl": SYNTHETIC,
                # Windows of 4 frames; an 80 ms audio chunk per 4 frames.
                "params": {
                    "inputs_per_step": 4,
                    "outputs_per_input": 0,
                    "visible": "audio",
                    "visible_every": 4,
                    "audio_samples": 1280,
                    "service_time_ms": 1.0,
                },
            },
        ],
        "edges": [
            {"from": "thinker", "to": "talker"},  # capacity: the default, 8
            {"from": "talker", "to": "code2wav", "capacity": 16},
        ],
    }
)


async def listen(pipeline: omnitrio.Pipeline, report: dict[str, str]) -> None:
    """Read one stream to its end: text deltas and audio chunks, in order."""
    text: list[str] = []
    audio: list[omnitrio.AudioChunk] = []
    async with pipeline.open_stream("Tell me a story.") as stream:
        async for item in stream:
            if isinstance(item, omnitrio.TextDelta):
                text.append(item.text)
            elif isinstance(item, omnitrio.AudioChunk):
                audio.append(item)
    seconds = sum(chunk.duration_s for chunk in audio)
    report["full"] = (
        f"full stream: text {''.join(text).strip()!r}\n"
        f"full stream: {len(audio)} audio chunks, {seconds:.2f} s of audio"
    )


async def peek(pipeline: omnitrio.Pipeline, report: dict[str, str]) -> None:
    """Take the first three items of a long answer, then leave: that cancels the stream."""
    request = omnitrio.Request("Recite pi.", options={"steps": 1000})  # per-stream override
    async with pipeline.open_stream(request) as stream:
        items = [await stream.receive() for _ in range(3)]
    # Leaving the block waited until every stage had dropped the stream.
    report["peek"] = f"peeked stream: cancelled after {len(items)} items"


async def main() -> None:
    report: dict[str, str] = {}
    async with omnitrio.open_pipeline(CONFIG) as pipeline:
        stages = " -> ".join(stage.name for stage in pipeline.config.stages)
        print(f"pipeline {pipeline.config.pipeline.name!r} ready: {stages}")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen, pipeline, report)
            nursery.start_soon(peek, pipeline, report)
        # Print after both streams ended, so the output does not depend on timing.
        print(report["full"])
        print(report["peek"])
        stats = pipeline.statistics()
        print(
            f"statistics: {stats.num_completed} completed, {stats.num_cancelled} cancelled, "
            f"{stats.num_failed} failed, {stats.num_open_streams} open; "
            f"edge payloads that reached a client: {stats.num_payloads_to_client}"
        )


if __name__ == "__main__":
    trio.run(main)
