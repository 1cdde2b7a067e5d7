"""Issue 27 #3's memory bound, without timing: on a pipeline whose answers never end by
themselves, what one stream may produce is bounded by ``max_output_tokens``. Asking
above it is refused (400 naming the field and the cap), and every answer at the cap
ends by itself after exactly the cap's tokens, its stream freed: what the attacker
made the server hold is given back. (The RSS figures are the attack kit's:
``benchmarks/reliability/attacks.py max-tokens``.)"""

from __future__ import annotations

import httpx
import openai
import trio

from tests.conftest import serve_chain

ENDLESS_TEXT: list[dict[str, object]] = [
    {"steps": 100_000, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]
CAP_TOKENS = 40
NUM_STREAMS = 6


def _attack(port: int) -> tuple[list[int], str]:
    """(text deltas of each streamed chat at the cap, the refusal's message above it)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "x"}
    ]
    try:
        client.chat.completions.create(model="m", messages=messages, max_tokens=CAP_TOKENS + 1)
    except openai.BadRequestError as exc:
        refusal = str(exc)
    else:
        raise AssertionError("max_tokens above the cap was accepted")
    streams = [
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=CAP_TOKENS, stream=True
        )
        for _ in range(NUM_STREAMS)
    ]
    deltas = []
    for stream in streams:
        with stream:
            deltas.append(
                sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
            )
    client.close()
    return deltas, refusal


async def test_answers_are_bounded_by_the_cap_and_their_streams_given_back(
    nursery: trio.Nursery,
) -> None:
    port = await serve_chain(
        nursery, ENDLESS_TEXT, 8, max_output_tokens=CAP_TOKENS, max_streams_per_client=8
    )
    with trio.fail_after(120):  # each answer ends by itself: none hangs
        deltas, refusal = await trio.to_thread.run_sync(_attack, port)
    assert "max_tokens" in refusal, refusal
    assert f"cap of {CAP_TOKENS}" in refusal, refusal
    assert deltas == [CAP_TOKENS] * NUM_STREAMS
    metrics = (await trio.to_thread.run_sync(httpx.get, f"http://127.0.0.1:{port}/metrics")).text
    assert "omnitrio_open_streams 0.0" in metrics  # each stream freed as its answer ended
    assert f'omnitrio_streams_total{{outcome="completed"}} {NUM_STREAMS}.0' in metrics
