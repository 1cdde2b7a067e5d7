"""The server as a process: start-up line, one-line errors, SIGTERM/SIGINT with streams open."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import websockets.sync.client

REPO = Path(__file__).resolve().parents[2]
SYNTHETIC = str(REPO / "configs" / "synthetic.yaml")
RUN_SYNTHETIC = [sys.executable, "-m", "omnitrio._cli", "run", "--config", SYNTHETIC]
"""`omnitrio run` on the synthetic pipeline: these tests need no model packages."""
SERVING = re.compile(r"omnitrio serving .* at (http://[\d.]+:\d+)")


def start_server(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "omnitrio._cli", "--log-level", "WARNING", "run", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if match := SERVING.search(line):
            realtime = process.stdout.readline()
            assert f"realtime: {match.group(1).replace('http', 'ws')}/v1/realtime" in realtime
            return process, match.group(1)
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"server did not start: {process.stderr.read() if process.stderr else ''}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_with_streams_open_exits_zero_within_the_grace_period(
    tmp_path: Path, signum: signal.Signals
) -> None:
    config = endless_config(tmp_path)
    server_tmp = tmp_path / "server-tmp"  # the server's TMPDIR: must stay empty
    server_tmp.mkdir()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    process, url = start_server(
        "--config",
        str(config),
        "--port",
        "0",
        "--grace-period-s",
        "1",
        "--max-streams-per-client",  # one client here fills the pipeline
        "64",
        "--max-connections-per-client",  # with 64 connections
        "128",
        env={"TMPDIR": str(server_tmp)},
    )
    readers: list[threading.Thread] = []
    try:
        for _ in range(64):  # 64 endless streaming responses in flight (max_streams)
            thread = threading.Thread(target=read_streaming_chat, args=(url,), daemon=True)
            thread.start()
            readers.append(thread)
        _wait_for_open_streams(url, 64)
        assert _child_processes(process.pid) == []
        _, err, elapsed = _signal_and_wait(process, signum)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert elapsed < 1 + 1.0 + 0.5, elapsed  # grace period + 1 s (+ interpreter exit)
    assert "omnitrio: stopped" in err
    assert list(server_tmp.iterdir()) == []
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert shm_after - shm_before == set()


def endless_config(tmp_path: Path) -> Path:
    """The synthetic pipeline with answers that never end by themselves."""
    config = tmp_path / "long.yaml"
    config.write_text(
        (REPO / "configs" / "synthetic.yaml")
        .read_text()
        .replace("steps: 24", "steps: 100000")
        # 64 endless streams fill the pipeline by count: admission by headroom would
        # refuse some of them once its step-time model says they no longer fit.
        .replace("  max_streams: 64\n", "  max_streams: 64\n  admission: max_streams\n")
    )
    return config


def read_streaming_chat(url: str) -> None:
    """Read one streaming chat completion until the server ends it."""
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            while response.read(1024):
                pass
    except (OSError, ValueError, http.client.HTTPException):
        pass  # the server ending the response mid-stream is the point


def _signal_and_wait(
    process: subprocess.Popen[str], signum: signal.Signals
) -> tuple[str, str, float]:
    """Send ``signum``; return (stdout, stderr, seconds until the process exited)."""
    process.send_signal(signum)
    started = time.monotonic()
    out, err = process.communicate(timeout=15)
    return out, err, time.monotonic() - started


def _child_processes(pid: int) -> list[str]:
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += (task / "children").read_text().split()
    return children


def _wait_for_open_streams(url: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # a process test: no event to wait on
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            text = response.read().decode()
        if f"omnitrio_open_streams {float(count)}" in text:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} streams never opened")


def test_sigterm_with_a_stalled_websocket_client_is_bounded(tmp_path: Path) -> None:
    config = tmp_path / "loud.yaml"
    config.write_text(
        (REPO / "configs" / "synthetic.yaml")
        .read_text()
        .replace("steps: 24", "steps: 100000")
        .replace("audio_samples: 1280", "audio_samples: 64000")
    )
    process, url = start_server("--config", str(config), "--port", "0", "--grace-period-s", "1")
    ws_url = url.replace("http", "ws") + "/v1/realtime"
    try:
        with websockets.sync.client.connect(ws_url, max_queue=1, ping_interval=None) as ws:
            ws.recv(timeout=10)
            ws.send(json.dumps({"type": "response.create"}))
            time.sleep(1.0)  # never read again: the server's writes to us stall
            _, err, elapsed = _signal_and_wait(process, signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert elapsed < 1 + 1.0 + 0.5, elapsed


def test_a_signal_while_stages_load_stops_at_once(tmp_path: Path) -> None:
    config = tmp_path / "slow.yaml"
    config.write_text(
        (REPO / "configs" / "synthetic.yaml")
        .read_text()
        .replace("steps: 24", "steps: 24\n      load_time_ms: 8000")
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "omnitrio._cli", "run", "--config", str(config), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        while "loading stage 'thinker'" not in process.stderr.readline():
            pass
        out, _, elapsed = _signal_and_wait(process, signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0
    assert "serving" not in out  # it never bound a port
    # The load itself (a thread) cannot be interrupted: the pipeline waits for it
    # up to shutdown_timeout_s (5 s), far less than the 8 s load.
    assert elapsed < 5 + 1.0, elapsed


def test_port_in_use_is_one_clear_line_before_any_stage_loads(tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"  # stages that take 20 s to load: the error must not wait
    slow.write_text(
        Path(SYNTHETIC).read_text().replace("steps: 24", "steps: 24\n      load_time_ms: 20000")
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "omnitrio._cli",
                "run",
                "--config",
                str(slow),
                "--port",
                str(port),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        elapsed = time.monotonic() - started
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("omnitrio:")]
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0], result.stderr
    assert "already in use" in lines[0], result.stderr
    assert "--port" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "loading stage" not in result.stderr
    assert elapsed < 10, elapsed  # the Python start-up and imports; no stage load


def test_version_and_log_level_after_the_subcommand() -> None:
    version = subprocess.run(
        [sys.executable, "-m", "omnitrio._cli", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert version.returncode == 0
    assert re.fullmatch(r"omnitrio \d+\.\d+\.\d+\S*\n", version.stdout), version.stdout
    process, url = start_server("--config", SYNTHETIC, "--port", "0", "--log-level", "ERROR")
    try:
        assert url.startswith("http://")
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    # start_server says WARNING before the subcommand; ERROR after it wins: no INFO lines.
    assert "INFO" not in err, err


def test_model_path_errors_are_one_clear_line(tmp_path: Path) -> None:
    for folder, message in [
        (tmp_path / "missing", "--model-path: no such folder; give a local model folder"),
        (tmp_path, "--model-path: no stage of pipeline 'synthetic-omni' loads a model"),
    ]:
        result = subprocess.run(
            [*RUN_SYNTHETIC, "--model-path", str(folder)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr


def test_model_path_on_the_voice_chat_names_the_stages_or_the_stage(tmp_path: Path) -> None:
    """STAGE=PATH names the stage to set; a stage that takes no model_path, or a path
    that does not exist, is refused before anything loads."""
    voice = [sys.executable, "-m", "omnitrio._cli", "run", "--port", "0"]  # the default config
    for args, message in [
        (
            ["--model-path", f"tts={tmp_path}"],
            "--model-path tts=...: stage 'tts' takes no model_path",
        ),
        (
            ["--model-path", f"llm={tmp_path / 'missing.gguf'}"],
            "--model-path llm=...: no such file or folder",
        ),
    ]:
        result = subprocess.run(
            [*voice, *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert "Traceback" not in result.stderr


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: {name: x}\nstages: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "omnitrio._cli", "run", "--config", str(bad), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert f"omnitrio: {bad}: stages: needs at least 1 entry; add one" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_non_loopback_bind_without_a_key_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMNITRIO_API_KEY"}
    result = subprocess.run(
        [*RUN_SYNTHETIC, "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "is not a loopback address, so an API key is required" in result.stderr
    assert "Traceback" not in result.stderr
