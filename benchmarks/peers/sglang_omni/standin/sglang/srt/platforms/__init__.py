"""``sglang.srt.platforms``: this host is always a CPU (stand-in)."""

from sglang.srt.platforms.cpu import CpuPlatform

current_platform = CpuPlatform()
