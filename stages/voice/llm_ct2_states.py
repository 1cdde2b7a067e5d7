"""The KV states CTranslate2 keeps for static prompts: which are kept, warming them ahead,
and a bound on their memory (llm_ct2.py).

CTranslate2 keeps the state after each static prompt it has prefilled (``static_prompt``
with ``cache_static_prompt``) in a map per loaded model, keyed by the prompt's exact
tokens, and reuses it in every later answer whose static prompt is the same. It never
drops one: the map lives as long as the ``Generator`` (its model), ~46 KB of keys and
values per token for SmolLM2-135M (30 layers x 2 x 3 heads x 64 x float32), ~75 KB
per token in the process's RSS as measured. The voice LLM's static prompt is the
system message and the conversation's earlier turns, different at every turn, so
the map would grow without end in a long-running server.

``StaticStates`` keeps the ledger: the static prompts the current generator has (or is
making) a state for, and their tokens. Once they pass ``budget_tokens`` a fresh
generator replaces the current one (made on the warming thread, ~0.15 s; the weights,
~70 MB, are loaded again), later answers start on it, and the old one is dropped once
its answers have all ended: memory stays under about two generators and the budget.
Dropping it happens on the warming thread (``ReleaseJob``), off the answers' path, and
then hands the freed pages back to the system (omnitrio's ``trim_heap``): glibc keeps the
freed model's and states' memory in its arenas otherwise, and the process's RSS grew
to ~2.5 GB where ~1.2 GB was in use (docs/models.md).

Warming: once an answer has ended, the next turn's static prompt (the system message
and the history with this turn in it) is known; ``Warmer`` prefills it on an idle
worker (a one-token generation with it as the static prompt), so the next answer only
prefills its question. States warmed but not used yet are warmed again on the fresh
generator when one replaces the old (as many as fit in half the budget).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ctranslate2

_logger = logging.getLogger(__name__)
Key = tuple[str, ...]  # a static prompt's tokens


@dataclass(frozen=True, slots=True)
class WarmJob:
    """A static prompt to prefill ahead; ``before`` runs first on the warming thread
    (it may wait, e.g. while another answer's first audio is made)."""

    key: Key
    before: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class RecycleJob:
    """Open a fresh generator in place of the current one."""


@dataclass(frozen=True, slots=True)
class ReleaseJob:
    """Drop the replaced generators whose answers have all ended."""


@dataclass(frozen=True, slots=True)
class FlushJob:
    """Set ``done`` once every job before it has run."""

    done: threading.Event


Job = WarmJob | RecycleJob | ReleaseJob


@dataclass
class _Entry:
    num_tokens: int
    pending: bool  # warmed ahead and not used by an answer yet


class StaticStates:
    """The ledger of the current generator's static-prompt states (see the module
    docstring). Every method is called with the runtime's lock held."""

    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens < 1:
            raise ValueError(f"ctranslate2_cache_tokens must be positive, not {budget_tokens}")
        self.budget_tokens = budget_tokens
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()  # least recently used first
        self.num_tokens = 0
        self.num_recycled = 0  # generators replaced so far
        self.num_warmed = 0  # states prefilled ahead
        self.num_hits = 0  # answers that started on a state warmed ahead

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def add(self, key: Key, *, pending: bool) -> bool:
        """The generator has (or is making) ``key``'s state; an answer uses it unless
        ``pending``. Whether it was there already."""
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(len(key), pending)
            self.num_tokens += len(key)
            return False
        if entry.pending and not pending:
            self.num_hits += 1
        entry.pending = entry.pending and pending
        self._entries.move_to_end(key)
        return True

    def fits(self, key: Key) -> bool:
        """Whether ``key``'s state can be added within the budget (always, to none)."""
        return not self._entries or self.num_tokens + len(key) <= self.budget_tokens

    def over_budget(self) -> bool:
        return self.num_tokens > self.budget_tokens

    def restart(self) -> list[Key]:
        """A fresh generator replaces the current one: the ledger starts empty; the
        states to warm again on it (pending ones, newest first, in half the budget)."""
        carried: list[Key] = []
        room = self.budget_tokens // 2
        for key, entry in reversed(self._entries.items()):
            if entry.pending and entry.num_tokens <= room:
                carried.append(key)
                room -= entry.num_tokens
        self._entries.clear()
        self.num_tokens = 0
        self.num_recycled += 1
        return carried


class WarmTarget:
    """What the warming thread calls (llm_ct2.Ct2Runtime)."""

    def warm_now(self, key: Key) -> None:
        raise NotImplementedError

    def recycle_now(self) -> None:
        raise NotImplementedError

    def release_now(self) -> None:
        raise NotImplementedError


class Warmer:
    """The warming thread: prefills static prompts ahead, one at a time, and opens the
    fresh generator when the ledger asks for one."""

    def __init__(self, runtime: WarmTarget) -> None:
        self._runtime = runtime
        self._jobs: queue.SimpleQueue[Job | FlushJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ct2-warm", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the jobs submitted so far have run; False after ``timeout_s``."""
        done = threading.Event()
        self._jobs.put(FlushJob(done))
        return done.wait(timeout_s)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if isinstance(job, FlushJob):
                job.done.set()
                continue
            try:
                if isinstance(job, RecycleJob):
                    self._runtime.recycle_now()
                elif isinstance(job, ReleaseJob):
                    self._runtime.release_now()
                else:
                    if job.before is not None:
                        job.before()
                    self._runtime.warm_now(job.key)
            except Exception:  # a state not warmed costs time, not answers: go on
                _logger.exception("CTranslate2's warming thread: %s failed", job)


def prefill(generator: ctranslate2.Generator, static: Sequence[str], start: str) -> None:
    """Make ``generator`` keep ``static``'s state: one token generated after it (the
    least CTranslate2 generates), from ``start``."""
    generator.generate_batch(
        [[start]],
        static_prompt=list(static),
        max_length=1,
        include_prompt_in_result=False,
        sampling_topk=1,
    )
