#!/usr/bin/env python
"""Hostile clients against a real ``omnitrio run`` on loopback (issue 16's findings).

    python benchmarks/reliability/attacks.py [ATTACK ...] [--checkout DIR] [--fd-limit N]

Starts ``python -m omnitrio run`` from ``--checkout`` (this checkout by
default; another one measures its code: "before" and "after" side by side) on
the synthetic pipeline, port 0, loopback, and runs each named attack (all by
default) against a fresh server. Each prints one line: what the attacker saw,
whether ``/health`` and a normal request were served meanwhile, and the
server's RSS and open fds before / after (from ``/proc``). Linux only.

wav-rate      chat completion with a WAV whose header claims 100 Hz, 0 Hz, 2**32-1 Hz
bad-host      ``Host: [``, ``[::1``, ``a]b`` and ``Origin: http://[``
speech-flood  150 concurrent /v1/audio/speech at max_streams 64: status codes, cut bodies
ws-leak       3 WebSocket clients send 1 MiB frames (a 1 MiB event_id, echoed in the error
              event) for 25 s without reading, get closed or dropped, leave; then the
              server's live trio tasks, fds, RSS and SIGTERM exit time
echo-flood    10 non-reading WebSocket clients, 1 MiB frames whose event_id is 1 MiB
unauth-trickle  (with an API key) 20 unauthenticated chunked uploads trickling a byte
              a second: how long the server keeps each connection
idle-conns    idle TCP connections up to the fd limit (``--fd-limit``, default 256):
              is /health still served, how are the extra ones refused
h2c           HTTP/2 prior knowledge: is it spoken
decode-flood  one client floods 1 MiB msgpack frames of 500,000 empty maps (then JSON
              arrays of 500,000 zeros, then tiny appends); another times text turns
              (first audio) meanwhile
signals       4 endless streaming chats, grace period 30 s; SIGTERM twice 0.3 s apart, SIGINT
              twice: exit status, time to exit, "stopped" line
tools-flood   (issue 27, in isolation_attacks.py, each beside a client timing normal chats)
              a chat with 19,000 tools, then 10 with 128 fresh tools each
ref-cycle     a tool schema that refers to itself, tool_choice required
fields        seed 2**70, max_tokens 10**9, arguments "[" x 200000, a long /static/ path,
              a 2 MB body to each /v1 POST
stream-share  one client (127.0.0.2) opens 64 endless streaming chats and holds them 8 s
realtime-tools  a Realtime session.update with 6,500 tools, then 8 with 128 fresh tools
small         Realtime 48 KB of "1,2," in one string, audio_end_ms 1e308, a transcription
              of a WAV with bits_per_sample 0, a streaming chat its client leaves
auth          (with an API key) ``bearer KEY`` and a bare key
max-tokens    16 streaming chats asking max_tokens 10**9 (endless pipeline) held 10 s, then
              16 at the cap (4096): the server's RSS idle, at its peak, after
r3-*          issue 42's eleven (round3_attacks.py), each beside a normal client, with the
              server's RSS, /health and a SIGTERM during a second run of the attack
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import SITECUSTOMIZE  # noqa: E402

API_KEY = "attack-test-key"


class Server:
    """``omnitrio run`` in a subprocess, from ``checkout``, on a synthetic pipeline."""

    def __init__(
        self,
        checkout: Path,
        *,
        api_key: str | None = None,
        fd_limit: int | None = None,
        endless: bool = False,
        grace_period_s: float = 2.0,
        config_name: str = "synthetic.yaml",
    ):
        config = Path(tempfile.mkdtemp()) / config_name
        text = (checkout / "configs" / config_name).read_text()
        if endless:  # answers that never end by themselves
            text = text.replace("steps: 24", "steps: 100000")
        config.write_text(text)
        args = [sys.executable, "-m", "omnitrio", "run", "--config", str(config)]
        args += ["--port", "0", "--grace-period-s", str(grace_period_s)]
        args += ["--api-key", api_key] if api_key else []

        def limit_fds() -> None:
            if fd_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        # soak.py's sitecustomize: the server reports its live trio tasks to a file.
        site = Path(tempfile.mkdtemp())
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.tasks_file = site / "tasks"
        env = dict(
            os.environ,
            PYTHONPATH=f"{site}{os.pathsep}{checkout}",
            OMNITRIO_SOAK_TASKS_FILE=str(self.tasks_file),
        )
        self.process = subprocess.Popen(
            args,
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limit_fds,
        )
        self.api_key = api_key
        self.stderr: list[str] = []
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        while "serving" not in line:
            if not line:
                raise RuntimeError("the server did not start: " + self.process.stderr.read())  # type: ignore[union-attr]
            line = self.process.stdout.readline()
        self.port = int(line.rsplit(":", 1)[1].split()[0])
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def tasks(self) -> int | None:
        """Live trio tasks in the server (reported once a second)."""
        time.sleep(1.2)
        try:
            return int(self.tasks_file.read_text())
        except (OSError, ValueError):
            return None

    def tracebacks(self) -> int:
        return sum("Traceback" in line for line in self.stderr)

    def stop(self) -> tuple[int, float]:
        """SIGTERM; (exit status, seconds to exit)."""
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, time.monotonic() - start


def http(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    source: str = "127.0.0.1",
) -> tuple[int | None, bytes]:
    """One HTTP/1.1 request on its own connection from ``source`` (a loopback
    address): (status, body); (None, b"") on a timeout."""
    head = {"Host": "127.0.0.1", "Content-Length": str(len(body)), "Connection": "close"}
    head.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in head.items()]
    try:
        with socket.create_connection(
            ("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0)
        ) as sock:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                ]
                if (length and len(rest) >= length[0]) or rest.endswith(b"\r\n0\r\n\r\n"):
                    break  # hypercorn may keep the connection open despite Connection: close
    except (TimeoutError, ConnectionError) as exc:
        return None, type(exc).__name__.encode()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return status, body


def _unchunk(data: bytes) -> bytes:
    body = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        body, data = body + data[:size], data[size + 2 :]
    return body


def chat(port: int, content: object, api_key: str | None = None) -> tuple[int | None, bytes]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return http(port, "POST", "/v1/chat/completions", body.encode(), headers)


def served(server: Server) -> str:
    health, _ = http(server.port, "GET", "/health", timeout_s=5)
    status, _ = chat(server.port, "hello", server.api_key)
    return f"/health {health}, text chat {status}"


def wav(rate_hz: int, num_samples: int) -> bytes:
    data = b"\x01\x00" * num_samples
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, rate_hz, (rate_hz * 2) & 0xFFFFFFFF, 2, 16)
    return header + b"data" + struct.pack("<I", len(data)) + data


def attack_wav_rate(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    try:
        results = []
        for rate_hz in (100, 0, 2**32 - 1):
            part = {"type": "input_audio", "input_audio": {"format": "wav", "data": ""}}
            part["input_audio"]["data"] = base64.b64encode(wav(rate_hz, 350_000)).decode()
            start = time.monotonic()
            status, body = chat(server.port, [part])
            message = body[:70].decode(errors="replace") if status != 200 else "ok"
            results.append(
                f"{rate_hz} Hz: {status} in {time.monotonic() - start:.1f} s ({message})"
            )
        return "; ".join(results) + f"; then {served(server)}; tracebacks {server.tracebacks()}"
    finally:
        server.stop()


def attack_bad_host(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    try:
        seen = []
        for name, value in [("Host", "["), ("Host", "[::1"), ("Host", "a]b")]:
            status, body = http(server.port, "GET", "/v1/models", headers={name: value})
            seen.append(f"{name}: {value} -> {status or body.decode()}")
        status, _ = http(server.port, "GET", "/v1/models", headers={"Origin": "http://["})
        seen.append(f"Origin: http://[ -> {status}")
        return ", ".join(seen) + f"; tracebacks {server.tracebacks()}"
    finally:
        server.stop()


def attack_speech_flood(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    outcomes: Counter[str] = Counter()

    def one() -> None:
        body = json.dumps({"model": "m", "input": "hello there", "response_format": "wav"})
        status, data = http(server.port, "POST", "/v1/audio/speech", body.encode(), timeout_s=60)
        cut = status == 200 and len(data) <= 64
        outcomes[f"{status}{' cut' if cut else ''}"] += 1

    try:
        threads = [threading.Thread(target=one) for _ in range(150)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        asgi_errors = sum("Error in ASGI" in line for line in server.stderr)
        return f"{dict(outcomes)}; 'Error in ASGI' logged {asgi_errors}x"
    finally:
        server.stop()


def _ws_connect(port: int, subprotocol: str = "omnitrio.json.v1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: {subprotocol}\r\n\r\n"
    )
    sock.sendall(request.encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(1)
    if b" 101 " not in response.split(b"\r\n")[0]:
        raise RuntimeError(f"no upgrade: {response[:80]!r}")
    return sock


def _ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    key = int.from_bytes(mask * ((length + 3) // 4), "big")  # the mask, repeated
    padded = payload + b"\0" * (-length % 4)
    body = (int.from_bytes(padded, "big") ^ key).to_bytes(len(padded), "big")[:length]
    return head + mask + body


def _flood_without_reading(port: int, frame: bytes, seconds: float, subprotocol: str) -> str:
    """Send ``frame`` repeatedly, never read; how it ended."""
    sock = _ws_connect(port, subprotocol)
    sock.settimeout(1.0)
    end = time.monotonic() + seconds
    sent = 0
    outcome = "still open"
    while time.monotonic() < end:
        try:
            sock.sendall(frame)
            sent += 1
        except TimeoutError:
            continue
        except OSError as exc:
            outcome = f"dropped ({type(exc).__name__}) after {sent} frames"
            break
    sock.close()
    return outcome


def _echo_flooders(port: int, count: int, seconds: float) -> list[threading.Thread]:
    """``count`` started non-reading clients sending 1 MiB frames whose event_id is 1 MiB."""
    event = {"type": "nonsense", "event_id": "e" * ((1 << 20) - 64)}
    frame = _ws_frame(json.dumps(event).encode())
    threads = [
        threading.Thread(
            target=_flood_without_reading, args=(port, frame, seconds, "omnitrio.json.v1")
        )
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def attack_ws_leak(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    try:
        fds0, rss0, tasks0 = server.fds(), server.rss_mb(), server.tasks()
        threads = _echo_flooders(server.port, 3, 25)
        for thread in threads:
            thread.join()
        time.sleep(3)
        fds1, rss1, tasks1 = server.fds(), server.rss_mb(), server.tasks()
        state = served(server)
    finally:
        code, seconds = server.stop()
    return (
        f"trio tasks {tasks0} -> {tasks1}, fds {fds0} -> {fds1}, "
        f"RSS {rss0:.0f} -> {rss1:.0f} MB after the clients left; "
        f"{state}; SIGTERM exit {code} in {seconds:.2f} s"
    )


def attack_echo_flood(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    try:
        rss0 = server.rss_mb()
        peak = rss0
        threads = _echo_flooders(server.port, 10, 14)
        while any(t.is_alive() for t in threads):
            peak = max(peak, server.rss_mb())
            time.sleep(0.5)
        time.sleep(3)
        return (
            f"RSS {rss0:.0f} -> peak {peak:.0f} -> {server.rss_mb():.0f} MB after; {served(server)}"
        )
    finally:
        server.stop()


def attack_unauth_trickle(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout, api_key=API_KEY)
    try:
        socks = []
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer wrong\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            socks.append(sock)
        opened = time.monotonic()
        open_for: list[float] = []
        while socks and time.monotonic() - opened < 30:
            for sock in list(socks):
                try:
                    sock.sendall(b"1\r\nx\r\n")
                    sock.setblocking(False)
                    try:
                        if sock.recv(65536) == b"":
                            raise ConnectionResetError
                    except BlockingIOError:
                        pass
                    sock.setblocking(True)
                except OSError:
                    open_for.append(time.monotonic() - opened)
                    socks.remove(sock)
                    sock.close()
            time.sleep(1.0)
        for sock in socks:
            sock.close()
        closed = f"{len(open_for)} of 20 closed by the server"
        if open_for:
            closed += f" after {statistics.median(open_for):.1f} s (median)"
        return f"{closed}; {len(socks)} still open at 30 s"
    finally:
        server.stop()


def attack_idle_conns(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout, fd_limit=fd_limit)
    socks: list[socket.socket] = []
    try:
        for _ in range(fd_limit - 10):
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(1.0)
        refused = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                data = sock.recv(4096)
                refused += data.startswith(b"HTTP/1.1 503")
            except BlockingIOError:
                pass
        health, _ = http(server.port, "GET", "/health", timeout_s=5)
        emfile = sum("Too many open files" in line for line in server.stderr)
        return (
            f"{len(socks)} idle connections: {refused} answered 503; /health {health}; "
            f"EMFILE log lines {emfile}; tracebacks {server.tracebacks()}"
        )
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def attack_h2c(checkout: Path, fd_limit: int) -> str:
    server = Server(checkout)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            # The client preface and an empty SETTINGS frame.
            sock.sendall(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            )
            try:
                reply = sock.recv(4096)
            except TimeoutError:
                reply = b""
        if reply.startswith(b"HTTP/1.1"):
            return "refused: " + reply.splitlines()[0].decode()
        return f"spoken: {len(reply)} bytes of HTTP/2 frames back"
    finally:
        server.stop()


def _decode_flood_frames(kind: str) -> tuple[bytes, str]:
    """(what the flooding client sends over and over, its subprotocol)."""
    import msgpack

    if kind == "maps":  # 1 MiB of empty msgpack maps
        return _ws_frame(msgpack.packb([{}] * 500_000), opcode=2), "omnitrio.msgpack.v1"
    if kind == "arrays":  # a JSON array of 500,000 zeros
        return _ws_frame(("[" + ",".join(["0"] * 500_000) + "]").encode()), "omnitrio.json.v1"
    # 64 tiny appends (2 bytes of audio each) per write
    append = json.dumps({"type": "input_audio_buffer.append", "audio": "AAA="}).encode()
    clear = json.dumps({"type": "input_audio_buffer.clear"}).encode()
    return b"".join(_ws_frame(append) for _ in range(63)) + _ws_frame(clear), "omnitrio.json.v1"


def attack_decode_flood(checkout: Path, fd_limit: int) -> str:
    return "; ".join(
        f"{kind}: {_decode_flood(checkout, kind)}" for kind in ("maps", "arrays", "appends")
    )


def _decode_flood(checkout: Path, kind: str) -> str:
    server = Server(checkout)
    try:
        frame, subprotocol = _decode_flood_frames(kind)
        stop = threading.Event()

        def flood() -> None:
            sock = _ws_connect(server.port, subprotocol)
            sock.settimeout(1.0)
            while not stop.is_set():
                try:
                    sock.sendall(frame)
                    sock.setblocking(False)
                    try:
                        while sock.recv(1 << 20):
                            pass
                    except BlockingIOError:
                        pass
                    sock.setblocking(True)
                    sock.settimeout(1.0)
                except OSError:
                    break
            sock.close()

        def first_audio_ms(turns: int) -> list[float]:
            times = []
            sock = _ws_connect(server.port, "omnitrio.json.v1")
            reader = sock.makefile("rb")
            for _ in range(turns):
                create = {"type": "response.create", "response": {"instructions": "hi"}}
                start = time.monotonic()
                sock.sendall(_ws_frame(json.dumps(create).encode()))
                first = None
                while True:
                    head = reader.read(2)
                    length = head[1] & 0x7F
                    if length == 126:
                        length = struct.unpack("!H", reader.read(2))[0]
                    elif length == 127:
                        length = struct.unpack("!Q", reader.read(8))[0]
                    event = json.loads(reader.read(length))
                    if event["type"].endswith("audio.delta") and first is None:
                        first = (time.monotonic() - start) * 1000
                    if event["type"] == "response.done":
                        break
                times.append(first or float("nan"))
            sock.close()
            return times

        quiet = first_audio_ms(5)
        thread = threading.Thread(target=flood)
        thread.start()
        time.sleep(1.0)
        loud = first_audio_ms(5)
        stop.set()
        thread.join()
        return (
            f"first audio median {statistics.median(quiet):.0f} ms alone, "
            f"{statistics.median(loud):.0f} ms during the flood"
        )
    finally:
        server.stop()


def attack_signals(checkout: Path, fd_limit: int) -> str:
    results = []
    for name in ("SIGTERM", "SIGINT"):
        server = Server(checkout, endless=True, grace_period_s=30)
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        ).encode()
        for _ in range(4):  # endless answers in flight: the grace period is used
            threading.Thread(
                target=http,
                args=(server.port, "POST", "/v1/chat/completions", body),
                kwargs={"timeout_s": 60},
                daemon=True,
            ).start()
        time.sleep(1.0)
        start = time.monotonic()
        server.process.send_signal(getattr(signal, name))
        time.sleep(0.3)
        with contextlib.suppress(ProcessLookupError):
            server.process.send_signal(getattr(signal, name))
        code = server.process.wait(timeout=90)
        time.sleep(0.2)
        stopped = any("omnitrio: stopped" in line for line in server.stderr)
        results.append(
            f"{name} x2: exit {code} in {time.monotonic() - start:.2f} s, stopped line {stopped}"
        )
    return "; ".join(results)


ATTACKS: dict[str, Callable[[Path, int], str]] = {
    "wav-rate": attack_wav_rate,
    "bad-host": attack_bad_host,
    "speech-flood": attack_speech_flood,
    "ws-leak": attack_ws_leak,
    "echo-flood": attack_echo_flood,
    "unauth-trickle": attack_unauth_trickle,
    "idle-conns": attack_idle_conns,
    "h2c": attack_h2c,
    "decode-flood": attack_decode_flood,
    "signals": attack_signals,
}


def _isolation_attacks() -> dict[str, Callable[[Path, int], str]]:
    from isolation_attacks import ISOLATION_ATTACKS  # issue 27's, beside normal clients
    from max_tokens_attack import attack_max_tokens
    from round3_attacks import ROUND3_ATTACKS  # issue 42's

    return {**ISOLATION_ATTACKS, "max-tokens": attack_max_tokens, **ROUND3_ATTACKS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("attacks", nargs="*", metavar="ATTACK", help=", ".join(ATTACKS))
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--fd-limit", type=int, default=256)
    args = parser.parse_args()
    ATTACKS.update(_isolation_attacks())
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}; known: {', '.join(ATTACKS)}")
    for name in args.attacks or list(ATTACKS):
        try:
            result = ATTACKS[name](args.checkout.resolve(), args.fd_limit)
        except Exception as exc:  # an attack that breaks is reported, the others still run
            result = f"attack failed: {type(exc).__name__}: {exc}"
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        print(f"{name}: {result} [load average {load}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
