"""Handing freed heap memory back to the system: ``trim_heap`` (glibc's ``malloc_trim``),
and ``HeapTrims``, which does it after big work has ended, one trim at a time.

glibc keeps what a process frees in its arenas, one per thread that allocated (the
stages' threads, onnxruntime's and CTranslate2's pools, the server's request
handling), and a block over its mmap threshold raises the threshold, so later blocks
that size come from the arenas too. So the RSS that one big request or session
brought the server to stays after it has ended, though nothing uses it: issue 42's
1 MB prompts kept +125 MB, a client's sessions full of input +80 MB. ``malloc_trim(0)``
gives every arena's free pages back. It walks all of them, holding each one's lock
meanwhile (a few ms on a GB heap): worth it after a big request, not after every
message. Stages call ``trim_heap`` from their own threads; the server trims after a
connection that moved much data has ended (server/_trim_after.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import trio


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    function = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


def trim_heap() -> bool:
    """Hand the process's free heap pages back to the system (every glibc arena);
    False where the C library cannot or there was nothing to give. Takes a few ms;
    not for an answer's path (a thread of its own, or a stage's between steps)."""
    function = _malloc_trim()
    return function is not None and bool(function(0))


class HeapTrims:
    """``trim_heap`` off the event loop after big work has ended, coalesced: an ask
    while a trim is running has the task running it trim once more after it (however
    many asked meanwhile) and returns at once. So trims never overlap, a flood of big
    requests costs one trim after another in one thread (each only as long as there
    is freed memory to give back: the first after a big free), and the last big
    request's memory is always trimmed after it ended. ``on_trim`` is called after
    each (the server's metric)."""

    def __init__(self, on_trim: Callable[[], None] | None = None) -> None:
        self.num_trims = 0
        self._on_trim = on_trim
        self._owed = False
        self._busy = False

    async def trim(self) -> None:
        """Trim now (in this task), or have the task trimming now trim again."""
        self._owed = True
        if self._busy:
            return
        self._busy = True
        try:
            while self._owed:
                self._owed = False
                # A thread: the trim takes milliseconds, which a shutdown waits for
                # (not abandoned: no thread is left running behind the server).
                await trio.to_thread.run_sync(trim_heap)
                self.num_trims += 1
                if self._on_trim is not None:
                    self._on_trim()
        finally:
            self._busy = False
