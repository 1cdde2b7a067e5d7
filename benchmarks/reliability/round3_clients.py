"""The clients of issue 42's attacks (round3_attacks.py): HTTP and WebSocket from a
chosen loopback address, the normal clients, and the judge that runs an attack beside
them and reports the issue's Targets."""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attacks import Server, http  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the helper shared with tests/
from tests.server.test_frame_limits import RawWebSocket

ATTACKER = "127.0.0.2"
BOUNDARY = "b0undary"


def post_json(port: int, path: str, body: dict[str, Any], source: str = "127.0.0.1") -> Any:
    """(status, body bytes) of a JSON POST from ``source``."""
    data = json.dumps(body).encode()
    return http(port, "POST", path, data, {"Content-Type": "application/json"}, 120.0, source)


def transcribe(port: int, audio: bytes, name: str, source: str = "127.0.0.1") -> Any:
    """(status, body bytes) of /v1/audio/transcriptions with ``audio`` as file ``name``."""
    form = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + audio
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    kind = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    return http(port, "POST", "/v1/audio/transcriptions", form, kind, 180.0, source)


def speech(port: int, text: str, fmt: str = "mp3", source: str = "127.0.0.1") -> Any:
    body = {"model": "m", "input": text, "voice": "alloy", "response_format": fmt}
    return post_json(port, "/v1/audio/speech", body, source)


def heard(port: int, audio: bytes, name: str = "a.mp3") -> str:
    """What the server's own ASR hears in ``audio`` ("" if it refused)."""
    status, data = transcribe(port, audio, name)
    return str(json.loads(data).get("text", "")) if status == 200 else f"({status})"


def ws_connect(
    port: int, source: str = "127.0.0.1", subprotocol: str = "omnitrio.json.v1"
) -> socket.socket:
    """A raw Realtime WebSocket from ``source`` (the 101 read; frames are the caller's)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {subprotocol}\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(1)
        if not chunk:
            break
        response += chunk
    if b" 101 " not in response.split(b"\r\n")[0]:
        sock.close()
        raise ConnectionRefusedError(response.split(b"\r\n")[0].decode(errors="replace"))
    return sock


def frame(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """A client frame, masked with a zero key (the tests' own)."""
    return bytes(RawWebSocket.frame(opcode, payload, fin=fin))


def chat_normal(port: int) -> float | None:
    """A plain chat (synthetic pipeline): its seconds, None if it failed."""
    started = time.perf_counter()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24}
    status, _ = post_json(port, "/v1/chat/completions", body)
    return time.perf_counter() - started if status == 200 else None


VOICE_PARTS: list[tuple[float, float, float]] = []
"""Each whole ``voice_normal``'s seconds by part (speech, transcription, chat), in order:
what the judge splits its median by."""


def voice_normal(port: int, clip_mp3: bytes) -> float | None:
    """A voice client's requests, one after another: a short speech, a 1 s transcription
    and a short chat (12 tokens); their seconds, None if one failed."""
    started = time.perf_counter()
    status, _ = speech(port, "Good morning to you.")
    spoken = time.perf_counter()
    if status != 200 or transcribe(port, clip_mp3, "a.mp3")[0] != 200:
        return None
    transcribed = time.perf_counter()
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 12}
    if post_json(port, "/v1/chat/completions", body)[0] != 200:
        return None
    ended = time.perf_counter()
    VOICE_PARTS.append((spoken - started, transcribed - spoken, ended - transcribed))
    return ended - started


def judge(server: Server, attack: Callable[[], str], normal: Callable[[], float | None]) -> str:
    """The attack's report; the normal client alone and beside it (failed, median and
    worst, ratio); the server's RSS before / peak / 5 s after, /health meanwhile; and
    the exit status and seconds of a SIGTERM sent 2 s into a second run of the attack."""
    first_part = len(VOICE_PARTS)  # an earlier attack's in this process are not this one's
    alone = [s for s in (normal() for _ in range(8)) if s is not None]
    num_parts_alone = len(VOICE_PARTS)
    baseline = server.rss_mb()
    peak = [baseline]
    health: Counter[int | None] = Counter()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            peak.append(server.rss_mb())
            health[http(server.port, "GET", "/health", timeout_s=5.0)[0]] += 1

    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.append(attack())
        except Exception as exc:
            outcome.append(f"attack failed: {type(exc).__name__}: {exc}")

    watcher, attacker = threading.Thread(target=watch), threading.Thread(target=run)
    watcher.start()
    attacker.start()
    during: list[float] = []
    failed = 0
    while attacker.is_alive() or len(during) + failed < 8:
        seconds = normal()
        if seconds is None:
            failed += 1
        else:
            during.append(seconds)
    attacker.join()
    done.set()
    watcher.join()
    parts = _parts(VOICE_PARTS[first_part:num_parts_alone], VOICE_PARTS[num_parts_alone:])
    waits = _admission_waits(http(server.port, "GET", "/metrics", timeout_s=5.0)[1])
    time.sleep(5.0)
    after = server.rss_mb()
    threading.Thread(target=run, daemon=True).start()  # again, and SIGTERM meanwhile
    time.sleep(2.0)
    code, exit_s = server.stop()
    ratio = statistics.median(during) / statistics.median(alone) if during and alone else None
    return (
        f"{outcome[0]} || normal: failed {failed} of {failed + len(during)}, median "
        f"{_ms(alone)} -> {_ms(during)} ms (ratio {ratio:.2f}), worst {_ms(alone, max)} -> "
        f"{_ms(during, max)} ms{parts}{waits} || RSS {baseline:.0f} MB, peak "
        f"+{max(peak) - baseline:.0f}, "
        f"after {after - baseline:+.0f} || /health {dict(health)} || SIGTERM during it: "
        f"exit {code} in {exit_s:.1f} s || tracebacks {server.tracebacks()}"
        if ratio is not None
        else f"{outcome[0]} || normal: none served (failed {failed})"
    )


def _parts(alone: list[tuple[float, ...]], during: list[tuple[float, ...]]) -> str:
    """The voice client's median by part, alone -> during ("" for another client)."""
    if not alone or not during:
        return ""
    medians = [
        "/".join(_ms([p[index] for p in runs]) for index in range(3)) for runs in (alone, during)
    ]
    return f", by part (speech/transcription/chat) {medians[0]} -> {medians[1]} ms"


def _admission_waits(metrics: bytes) -> str:
    """The server's admission waits so far (``/metrics``: by outcome, their seconds, the
    longest) and its refusals by reason."""
    counts: dict[str, float] = {}
    for line in metrics.decode(errors="replace").splitlines():
        for name in (
            "omnitrio_admission_wait",
            "omnitrio_admission_longest",
            "omnitrio_refusals_total",
        ):
            if line.startswith(name) and "_created" not in line:  # not a counter's birth time
                key, value = line.rsplit(" ", 1)
                counts[key] = float(value)
    return f", admission waits {counts}" if counts else ""


def _ms(values: list[float], pick: Callable[[list[float]], float] = statistics.median) -> str:
    return f"{pick(values) * 1000:.0f}" if values else "-"
