"""``sglang.srt.utils.kill_itself_when_parent_died`` (stand-in): a stage process ends with
the process that spawned it (Linux's parent-death signal)."""

import ctypes
import signal
import sys


def kill_itself_when_parent_died() -> None:
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL("libc.so.6")
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
