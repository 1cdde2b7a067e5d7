"""The soak script in short mode: the real server, 8 conversations with churn, ~30 s.

The 10-minute run (``benchmarks/reliability/soak.py --minutes 10 --conversations 32``) is reported
in docs/reliability.md; this keeps the script itself working.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the soak script reads /proc")
def test_soak_short_mode_passes(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "reliability" / "soak.py"),
            *("--minutes", "0.3", "--conversations", "8", "--json", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())["result"]
    assert report["ok"]
    assert report["outcomes"].get("completed", 0) > 0
    assert not report["unexpected_turns"]
    assert elapsed < 40, f"the short soak took {elapsed:.0f} s"
