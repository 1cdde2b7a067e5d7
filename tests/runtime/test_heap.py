"""Freed heap handed back to the system (omnitrio/_heap.py): ``trim_heap`` gives what a
thread freed back, and ``HeapTrims`` coalesces the trims that big work asks for."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from pathlib import Path

import pytest
import trio

from omnitrio import trim_heap
from omnitrio._heap import HeapTrims


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_gives_a_threads_freed_memory_back() -> None:
    """What a thread freed stays in its glibc arena (CTranslate2's workers: the voice
    LLM's RSS grew to ~2.5 GB in a long run, ~1.2 GB with the trim): ``trim_heap``
    hands it back."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    block = 32 * 1024  # under the mmap threshold: from the thread's arena
    rss_mib: list[float] = []

    def rss() -> float:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20

    def work() -> None:  # a thread of its own, as CTranslate2's workers: not the main arena
        blocks = [libc.malloc(block) for _ in range(4096)]  # 128 MiB, touched
        for address in blocks:
            libc.memset(address, 1, block)
        for address in blocks[:-1]:  # the last one stays: the arena's top is in use
            libc.free(address)
        rss_mib.append(rss())
        assert trim_heap()
        rss_mib.append(rss())
        libc.free(blocks[-1])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    freed, trimmed = rss_mib
    assert freed - trimmed > 100, rss_mib


async def test_asks_while_a_trim_runs_make_one_more_trim_not_one_each() -> None:
    """Five ask together: the first to run trims; the four others, run while its trim
    is out in a thread, return at once, and it trims once more after it (what they
    freed is given back too)."""
    trims = HeapTrims()
    returned: list[int] = []  # trims made when each ask returned

    async def ask() -> None:
        await trims.trim()
        returned.append(trims.num_trims)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ask)
        assert trims.num_trims == 2
        assert sorted(returned) == [0, 0, 0, 0, 2]
        await trims.trim()  # nobody trimming: a trim of its own
        assert trims.num_trims == 3
