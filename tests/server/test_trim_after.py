"""The server hands freed heap back after big work (omnitrio/server/_trim_after.py):
after an HTTP request or a Realtime session that moved at least ``TRIM_AFTER_BYTES``
(128 KiB), never after a small one (issue 42: memory kept after attacks 10 and 11)."""

from __future__ import annotations

import base64
import json
import re
import urllib.request

import trio
import trio_websocket

from omnitrio.server import ServerSettings, serve
from omnitrio.server._trim_after import TRIM_AFTER_BYTES
from tests.conftest import chain_config

SPEAKING = [
    {"steps": 2, "service_time_ms": 1.0},
    {"outputs_per_input": 0, "visible": "audio", "audio_samples": 320},
]


def _post_chat(base_url: str, text: str) -> int:
    body = json.dumps({"model": "test", "messages": [{"role": "user", "content": text}]})
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        data=body.encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
        return int(response.status)


def _trims(base_url: str) -> float:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    (value,) = re.findall(r"^omnitrio_heap_trims_total (\S+)$", text, re.MULTILINE)
    return float(value)


async def _trims_become(base_url: str, expected: float) -> None:
    """The trim runs once the request's handler has returned, just after its response."""
    seen = []
    for _ in range(100):  # 5 s at most
        seen.append(await trio.to_thread.run_sync(_trims, base_url))
        if seen[-1] == expected:
            return
        await trio.sleep(0.05)
    raise AssertionError(f"omnitrio_heap_trims_total stayed at {seen[-1]}, not {expected}")


async def test_a_big_request_or_session_trims_once_it_ended_a_small_one_never(
    nursery: trio.Nursery,
) -> None:
    config = chain_config(SPEAKING, max_streams=4)
    (base_url, *_) = await nursery.start(serve, config, ServerSettings(port=0))
    base_url = str(base_url)
    for _ in range(10):
        assert await trio.to_thread.run_sync(_post_chat, base_url, "hello") == 200
    assert await trio.to_thread.run_sync(_trims, base_url) == 0.0
    big = "pod bay " * (TRIM_AFTER_BYTES // 8 + 1)
    assert await trio.to_thread.run_sync(_post_chat, base_url, big) == 200
    await _trims_become(base_url, 1.0)

    # A Realtime session: 6 appends of 1 s of audio (~64 KB of base64 each), then closed.
    audio = base64.b64encode(bytes(48_000)).decode()
    message = json.dumps({"type": "input_audio_buffer.append", "audio": audio})
    url = base_url.replace("http", "ws") + "/v1/realtime"
    async with trio_websocket.open_websocket_url(url) as ws:
        for _ in range(6):
            await ws.send_message(message)
        await ws.send_message(json.dumps({"type": "input_audio_buffer.clear"}))
        assert json.loads(await ws.get_message())["type"] == "session.created"
    await _trims_become(base_url, 2.0)
