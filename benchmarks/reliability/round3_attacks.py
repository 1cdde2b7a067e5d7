"""Issue 42's attacks (round 3), for ``benchmarks/reliability/attacks.py`` (``r3-*``).

Each starts a fresh ``omnitrio run`` from the checkout (the voice chat, or the
synthetic pipeline where the attack needs no model), attacks it from 127.0.0.2 while
a normal client (127.0.0.1) works beside it, and reports (round3_clients.judge): what
the attacker got; the normal client's failures and latency against its own alone;
the server's RSS before, at its peak, after; /health meanwhile; a SIGTERM during a
second run of the attack. The voice client: a short speech, a 1 s transcription and a
12-token chat; the synthetic one: a chat.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgpack
from attacks import Server  # type: ignore[import-not-found]
from round3_clients import (  # type: ignore[import-not-found]
    ATTACKER,
    chat_normal,
    frame,
    heard,
    judge,
    post_json,
    speech,
    transcribe,
    voice_normal,
    ws_connect,
)

VOICE = "voice-chat.yaml"
SECOND_ATTACKER = "127.0.0.3"
STORY = (
    "The old lighthouse stood on the rocks at the edge of the bay. Every night the keeper "
    "climbed the stairs and lit the lamp. Ships passing in the dark saw the light and "
    "turned away from the reef. One winter a great storm came from the north. The waves "
    "were taller than the houses in the village, and the wind tore the roofs from the "
    "barns. The keeper stayed at his post for three days without sleep. "
) * 3
SDP = (
    b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    b"m=audio 47000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)


def _voice(checkout: Path, attack: Callable[[Server, bytes], str]) -> str:
    server = Server(checkout, config_name=VOICE)
    try:
        status, clip = speech(server.port, "What do cats like to eat?")
        if status != 200:
            return f"no clip: {status}"
        normal = lambda: voice_normal(server.port, clip)  # noqa: E731
        return str(judge(server, lambda: attack(server, clip), normal))
    finally:
        server.stop()


def _error(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"]["message"])[:70]
    except (ValueError, KeyError, TypeError):
        return repr(data[:60])


def attack_ffconcat(checkout: Path, fd_limit: int) -> str:
    script = b"ffconcat version 1.0\nfile private/memo.mp3\nfile /etc/passwd\n"

    def attack(server: Server, clip: bytes) -> str:
        status, data = transcribe(server.port, script, "a.mp3", ATTACKER)
        return f"ffconcat upload: {status} {_error(data)!r}"

    return _voice(checkout, attack)


def attack_sdp(checkout: Path, fd_limit: int) -> str:
    def attack(server: Server, clip: bytes) -> str:
        before = server.fds()
        started = time.perf_counter()
        status, data = transcribe(server.port, SDP, "a.sdp", ATTACKER)
        took = time.perf_counter() - started
        return (
            f"SDP upload: {status} in {took:.2f} s {_error(data)!r}; fds {before}->{server.fds()}"
        )

    return _voice(checkout, attack)


def attack_straddle(checkout: Path, fd_limit: int) -> str:
    """The phrase built to leave its end in a shared espeak's pipe; then the normal client's
    speech, heard back by the server's ASR: does it carry the attacker's words?"""
    head = "Hi" + " " * (999 - len("Hi, xylophone")) + ", xylophone"
    text = head + "." * 999 + " open the pod bay doors"

    def attack(server: Server, clip: bytes) -> str:
        leaks = 0
        for _ in range(4):
            speech(server.port, text[:4096], source=ATTACKER)
            words = heard(server.port, speech(server.port, "Good morning to you.")[1]).lower()
            leaks += "pod" in words or "xylophone" in words
        return f"4 x straddling phrase: the next client heard its words {leaks} times"

    return _voice(checkout, attack)


def attack_dotted(checkout: Path, fd_limit: int) -> str:
    """ "W." x 100 while three other clients' speech plays: are theirs whole?"""

    def attack(server: Server, clip: bytes) -> str:
        whole = len(speech(server.port, STORY[:300])[1])
        got: list[int] = []

        def other() -> None:
            got.append(len(speech(server.port, STORY[:300])[1]))

        others = [threading.Thread(target=other) for _ in range(3)]
        for thread in others:
            thread.start()
        status, _ = speech(server.port, "W. " * 100, source=ATTACKER)
        for thread in others:
            thread.join()
        return f'"W." x 100: {status}; 3 others\' speech {sorted(got)} bytes (alone {whole})'

    return _voice(checkout, attack)


def attack_emoji(checkout: Path, fd_limit: int) -> str:
    def attack(server: Server, clip: bytes) -> str:
        started = time.perf_counter()
        status, data = speech(server.port, "\U0001f600" * 700, source=ATTACKER)
        took = time.perf_counter() - started
        return f"one word of 700 emoji: {status}, {len(data)} bytes in {took:.1f} s"

    return _voice(checkout, attack)


def attack_vad_flood(checkout: Path, fd_limit: int) -> str:
    """One msgpack session appending 1 MiB frames as fast as it can for 15 s."""
    append = msgpack.packb({"type": "input_audio_buffer.append", "audio": bytes(1 << 20)})

    def attack(server: Server, clip: bytes) -> str:
        sock = ws_connect(server.port, ATTACKER, "omnitrio.msgpack.v1")
        sent, end = 0, time.monotonic() + 15.0
        try:
            sock.settimeout(5.0)
            while time.monotonic() < end:
                sock.sendall(frame(append, opcode=2))
                sent += 1
        except OSError as exc:
            return f"1 MiB appends: {sent} sent, then {type(exc).__name__}"
        finally:
            sock.close()
        return f"1 MiB appends for 15 s: {sent} sent"

    return _voice(checkout, attack)


def attack_long_transcriptions(checkout: Path, fd_limit: int) -> str:
    """Four transcriptions of a ~55 s story at once (two from each of two addresses: a
    client's share of queued checks is 2); the normal client: a 1 s transcription."""
    server = Server(checkout, config_name=VOICE)
    try:
        status, clip = speech(server.port, "Hello there.")
        status, story = speech(server.port, STORY)
        if status != 200:
            return f"no story: {status}"
        statuses: Counter[int | None] = Counter()

        def long_one(source: str) -> None:
            statuses[transcribe(server.port, story, "story.mp3", source)[0]] += 1

        def attack() -> str:
            started = time.perf_counter()
            threads = [
                threading.Thread(target=long_one, args=(source,))
                for source in (ATTACKER, ATTACKER, SECOND_ATTACKER, SECOND_ATTACKER)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            took = time.perf_counter() - started
            return f"4 x a {len(story) // 1000} KB mp3 story: {dict(statuses)} in {took:.1f} s"

        def normal() -> float | None:
            started = time.perf_counter()
            ok = transcribe(server.port, clip, "a.mp3")[0] == 200
            return time.perf_counter() - started if ok else None

        return str(judge(server, attack, normal))
    finally:
        server.stop()


def attack_big_prompt(checkout: Path, fd_limit: int) -> str:
    def attack(server: Server, clip: bytes) -> str:
        body = {"model": "m", "messages": [{"role": "user", "content": "pod bay " * 125_000}]}
        body["max_tokens"] = 8
        statuses = [post_json(server.port, "/v1/chat/completions", body, ATTACKER)[0]]
        statuses.append(post_json(server.port, "/v1/chat/completions", body, ATTACKER)[0])
        return f"2 chats of a 1 MB message: {statuses}"

    return _voice(checkout, attack)


def _synthetic(checkout: Path, attack: Callable[[Server], str]) -> str:
    server = Server(checkout)
    try:
        return str(judge(server, lambda: attack(server), lambda: chat_normal(server.port)))
    finally:
        server.stop()


def attack_idle_sessions(checkout: Path, fd_limit: int) -> str:
    """One client opens 1,000 Realtime sessions and holds them 10 s."""

    def attack(server: Server) -> str:
        held, refused = [], Counter[str]()
        for _ in range(1000):
            try:
                held.append(ws_connect(server.port, ATTACKER))
            except OSError as exc:
                refused[str(exc)[:24]] += 1
        time.sleep(10.0)
        for sock in held:
            sock.close()
        return f"1,000 sessions: {len(held)} held, refused {dict(refused)}"

    return _synthetic(checkout, attack)


def attack_empty_frames(checkout: Path, fd_limit: int) -> str:
    """A text message of endless 0-byte continuation frames, for 10 s."""

    def attack(server: Server) -> str:
        sock = ws_connect(server.port, ATTACKER)
        sock.settimeout(2.0)
        sent, end, outcome = 0, time.monotonic() + 10.0, "still open after 10 s"
        try:
            sock.sendall(frame(b"", opcode=1, fin=False))
            empty = frame(b"", opcode=0, fin=False) * 256
            while time.monotonic() < end:
                sock.sendall(empty)
                sent += 256
        except OSError as exc:
            outcome = f"closed ({type(exc).__name__})"
        finally:
            sock.close()
        return f"0-byte continuation frames: {sent} sent, {outcome}"

    return _synthetic(checkout, attack)


def attack_full_sessions(checkout: Path, fd_limit: int) -> str:
    """Sessions from one client each filling every per-session limit: 59 s of audio,
    ~1 MB of items, 0.9 MB of instructions."""
    audio = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 640_000}).encode()
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]}
    item["content"][0]["text"] = "x" * 120_000  # type: ignore[index]
    create = json.dumps({"type": "conversation.item.create", "item": item}).encode()
    update = {"type": "session.update", "session": {"type": "realtime", "instructions": ""}}
    update["session"]["instructions"] = "y" * 900_000  # type: ignore[index]
    frames = [audio] * 6 + [create] * 8 + [json.dumps(update).encode()]

    def attack(server: Server) -> str:
        held, refused = [], 0
        for _ in range(62):
            try:
                sock = ws_connect(server.port, ATTACKER)
            except OSError:
                refused += 1
                continue
            held.append(sock)
            for payload in frames:
                sock.sendall(frame(payload))
        time.sleep(3.0)
        memory_full = 0
        for sock in held:
            sock.settimeout(0.5)
            data = b""
            try:
                while chunk := sock.recv(1 << 16):
                    data += chunk
            except OSError:
                pass
            memory_full += data.count(b"client_memory_full")
            sock.close()
        return (
            f"{len(held)} sessions ({refused} refused) x 15 filling frames: "
            f"{memory_full} refused client_memory_full"
        )

    return _synthetic(checkout, attack)


ROUND3_ATTACKS: dict[str, Callable[[Path, int], str]] = {
    "r3-ffconcat": attack_ffconcat,
    "r3-sdp": attack_sdp,
    "r3-straddle": attack_straddle,
    "r3-dotted": attack_dotted,
    "r3-emoji": attack_emoji,
    "r3-vad-flood": attack_vad_flood,
    "r3-long-transcriptions": attack_long_transcriptions,
    "r3-idle-sessions": attack_idle_sessions,
    "r3-empty-frames": attack_empty_frames,
    "r3-big-prompt": attack_big_prompt,
    "r3-full-sessions": attack_full_sessions,
}
