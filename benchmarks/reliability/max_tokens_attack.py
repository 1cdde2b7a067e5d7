"""Issue 27 #3's memory, for ``benchmarks/reliability/attacks.py max-tokens``: the server's RSS
while one client asks for answers past the ``max_tokens`` cap, at the cap, and after.

16 streaming chats asking ``max_tokens: 10**9`` of an endless synthetic pipeline were
accepted and ran until their client left (on the voice chat: RSS +7.6 MB/s); the cap
(``ServerSettings.max_output_tokens``, 4096) refuses them, and answers at the cap end
by themselves. RSS is sampled from ``/proc`` every 0.2 s.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

from attacks import Server  # type: ignore[import-not-found]
from isolation_attacks import (  # type: ignore[import-not-found]
    ATTACKER,
    NORMAL_FIELDS,
    _beside,
    _endless_chat,
    _post,
    _status,
)


def attack_max_tokens(checkout: Path, fd_limit: int) -> str:
    """Issue 27 #3's memory: 16 streaming chats asking max_tokens 10**9 on an endless
    pipeline, held 10 s; then 16 non-streaming chats at the cap (4096 tokens, read to
    their end). The server's RSS (``/proc``) idle, at its peak in each phase, and after
    (3 s after the last one ended; the at-the-cap round twice, to see whether what
    stays after grows), beside normal chats."""
    server = Server(checkout, endless=True)
    samples: list[tuple[str, float]] = []
    phase = ["idle"]
    done = threading.Event()
    after_mb: list[float] = []  # 3 s after each round at the cap

    def sample() -> None:
        while not done.wait(0.2):
            samples.append((phase[0], server.rss_mb()))

    def attack() -> str:
        phase[0] = "over the cap"
        held = [_endless_chat(server.port, ATTACKER, {"max_tokens": 10**9}) for _ in range(16)]
        statuses = Counter(_status(sock) for sock in held)
        time.sleep(10.0)
        for sock in held:
            sock.close()
        at_cap: Counter[int | None] = Counter()
        lock = threading.Lock()

        def one() -> None:
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            status, _ = _post(server.port, {**body, "max_tokens": 4096}, ATTACKER)
            with lock:
                at_cap[status] += 1

        seconds = []
        for round_ in (1, 2):  # twice: the second shows whether what stays after grows
            phase[0] = "at the cap"
            started = time.perf_counter()
            threads = [threading.Thread(target=one) for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds.append(time.perf_counter() - started)
            phase[0] = f"after {round_}"
            time.sleep(3.0)
            after_mb.append(server.rss_mb())
        took = " and ".join(f"{s:.0f} s" for s in seconds)
        return f"max_tokens 10**9: {dict(statuses)}; 2 x 16 at the cap: {dict(at_cap)} in {took}"

    for _ in range(5):  # warm-up: the first chats' allocations are not the attack's
        _post(
            server.port,
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], **NORMAL_FIELDS},
        )
    idle_mb = server.rss_mb()
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        report = _beside(server, attack)
    finally:
        done.set()
        sampler.join()
        server.stop()

    def peak(name: str) -> str:
        values = [mb for label, mb in samples if label == name]
        return f"{max(values):.0f}" if values else "-"

    return (
        f"{report}; RSS idle {idle_mb:.0f} MB, peak over the cap {peak('over the cap')}, "
        f"peak at the cap {peak('at the cap')}, after each round at the cap "
        f"{' and '.join(f'{mb:.0f}' for mb in after_mb)} MB"
    )
