"""benchmarks/voice_latency.py's own arithmetic: the server's CPU time, other
processes' CPU time and percentiles."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

from benchmarks.voice_latency import cpu_seconds, percentile, run_dry


def test_cpu_seconds_counts_a_process_and_the_children_it_waited_for() -> None:
    before = cpu_seconds(os.getpid())
    # A child that burns ~0.3 s of CPU, waited for: counted in the parent's cutime.
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert cpu_seconds(os.getpid()) - before >= 0.25
    assert math.isnan(cpu_seconds(0))  # no such process


def test_others_cpu_seconds_counts_a_busy_process_that_is_not_the_server() -> None:
    """The CPU other processes took from the cores over a level (the table's last
    column, in cores): a busy process that is neither the server nor this one, nor
    one it waited for, is counted."""
    from benchmarks.voice_latency import Level, breakdown, others_cpu_seconds

    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    server = subprocess.Popen(["sleep", "30"])  # an idle server
    try:
        before = others_cpu_seconds(server.pid)
        other = subprocess.Popen([sys.executable, "-c", burn])
        deadline = time.monotonic() + 30
        while not cpu_seconds(other.pid) >= 0.35 and time.monotonic() < deadline:
            time.sleep(0.01)  # running (or done), not yet waited for
        after = others_cpu_seconds(server.pid)
        other.wait()
    finally:
        server.kill()
        server.wait()
    assert after - before >= 0.3
    level = Level(4, wall_s=10.0, others_cpu_s=5.0)
    assert breakdown([level]).splitlines()[-1].endswith("| 0.50 |")  # cores, on average


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 90) == 5.0


def test_run_dry_counts_a_gap_once_and_playing_resumes_after_it() -> None:
    start = 10.0
    assert run_dry(start, 0.0, 10.0) == (10.0, 0.0)  # the first delta
    assert run_dry(start, 2.0, 11.5) == (10.0, 0.0)  # 0.5 s of audio still to play
    started, dry = run_dry(start, 2.0, 12.5)  # 0.5 s after the 2 s ran out
    assert (started, dry) == (10.5, 0.5)
    assert run_dry(started, 3.0, 13.0) == (10.5, 0.0)  # resumed: 0.5 s left


def test_track_gaps_counts_lost_frames_and_the_buffer_a_late_one_needs() -> None:
    from tests.webrtc_support import track_gaps

    frames = [(0.0, 0), (0.020, 960), (0.040, 1920), (0.090, 2880), (0.100, 4800)]
    lost, late_s = track_gaps(frames)  # 2880 came 30 ms late; 3840 never came
    assert lost == 1
    assert abs(late_s - 0.030) < 1e-9
    early = [(0.0, 0), (0.005, 960), (0.025, 1920)]  # a frame sent early: no lateness
    assert track_gaps(early) == (0, 0.0)


# i41's block: the admission waits, read off the server's own /metrics families.
def test_the_admission_waits_are_read_off_the_servers_metrics_per_level() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from benchmarks.voice_latency import Level, admission_waits, waits_report
    from omnitrio._statistics import AdmissionWaitStatistics
    from omnitrio.server._collectors import _admission_waits

    def scraped(waits: AdmissionWaitStatistics) -> dict[str, float]:
        registry = CollectorRegistry()
        registry.register(type("Waits", (), {"collect": lambda self: _admission_waits(waits)})())
        return admission_waits(generate_latest(registry).decode())

    before = scraped(AdmissionWaitStatistics(num_admitted=2, wait_s=0.5))
    after = scraped(AdmissionWaitStatistics(num_admitted=5, num_refused=1, wait_s=2.5))
    level = Level(4, busy_s={name: after[name] - before[name] for name in after})
    assert waits_report([level]) == (
        "websocket, 4 conversations: 4 requests waited to be admitted (2.00 s in all, 0.50 s "
        "each), 3 then admitted, 1 refused, 0 left while waiting"
    )
    assert "no admission waits reported" in waits_report([Level(1, busy_s=admission_waits(""))])
