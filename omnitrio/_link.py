"""Per-stream links: the bounded channel one stream has on one edge, and wake-ups.

A ``Link`` is a bounded channel of fixed capacity: on an edge between two stages a
deque (both ends are the trio thread's plain calls: ``put`` after a step, ``take``
in a plan; nothing awaits it), and to the client a ``ClientLink``, the same deque
that the client's task awaits (``ClientLink.receive``). Its free capacity is the stream's credit
on that edge. Producers never block on it: an actor
*reserves* credit for a stream before a step (so the step's output is sure to
fit) and puts the output afterwards without waiting. A stream without
enough credit is simply not scheduled, and its producer leaves its ``Wakeup`` on
the link (``wait_for_credit``). Every put wakes the consumer; credit coming back
(a take, an unused reservation, a discard) wakes exactly the producers that were
waiting for it. Nobody polls, and nobody is woken for nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import outcome
import trio


class Wakeup:
    """A level-triggered wake-up flag for one waiting task (no lost wake-ups).

    ``set()`` may be called any number of times from trio code; ``wait()``
    returns once at least one ``set()`` happened since the last consumption
    (by ``wait()`` itself or by ``consume()``).
    """

    def __init__(self) -> None:
        self._pending = False
        self._event = trio.Event()

    def set(self) -> None:
        if not self._pending:
            self._pending = True
            self._event.set()

    def consume(self) -> bool:
        """Take a pending wake-up without waiting; True if there was one."""
        if not self._pending:
            return False
        self._pending = False
        self._event = trio.Event()
        return True

    async def wait(self) -> bool:
        """Block until ``set()`` was called; cancellable, consumes the wake-up. Returns
        False if someone else consumed it first (the waiter has nothing new to see)."""
        if self._pending:
            await trio.lowlevel.checkpoint()
        else:
            await self._event.wait()
        return self.consume()


class Link:
    """One stream's bounded channel on one edge: items wait in a deque, at most
    ``capacity`` of them (a put past it raises ``trio.WouldBlock``, as a full trio
    channel's ``send_nowait`` would; credit reserved before each step keeps it from
    happening)."""

    def __init__(self, name: str, capacity: int, num_producers: int = 1) -> None:
        self.name = name
        self.capacity = capacity
        self._items: deque[object] = deque()
        self._closed = False  # no producer will put again (EOF once the items are taken)
        self._reserved = 0
        self._producers_open = num_producers
        self._credit_waiters: list[tuple[Wakeup, int]] = []  # and the credit each needs
        self.consumer_wakeup: Wakeup | None = None
        self.num_put = 0
        self.num_taken = 0
        self.discarded = False

    @property
    def buffered(self) -> int:
        """Items sent and not yet received (kept as counts: the scheduler reads it a lot)."""
        return 0 if self.discarded else self.num_put - self.num_taken

    @property
    def free(self) -> int:
        if self.discarded:
            return self.capacity  # nobody will read it: never hold a producer back
        return self.capacity - self.buffered - self._reserved

    @property
    def producers_done(self) -> bool:
        return self._producers_open == 0

    def reserve(self, count: int) -> None:
        self._reserved += count

    def settle(self, reserved: int, used: int | None) -> None:
        """Return a reservation after the step. If ``used`` (items put) is given and
        below ``reserved``, credit was freed: wake the producers, since one of them may
        have been skipped for want of exactly that credit."""
        self._reserved -= reserved
        if used is not None and used < reserved and self._credit_waiters:
            self.wake_producers()

    def put(self, items: Iterable[object], *, wake: bool = True) -> None:
        """Send items that fit in reserved credit; wakes the consumer (unless the
        caller hands the consumer its work itself). Never blocks.

        Items for a discarded link (its stream ended) are dropped.
        """
        if self.discarded:
            return
        sent = self._send_all(items)
        if sent:
            self.num_put += sent
            if wake:
                self._wake_consumer()

    def take(self, limit: int | None) -> tuple[list[object], bool]:
        """Receive up to ``limit`` buffered items (all if None); returns (items, closed).

        ``closed`` is true when the producers are done and nothing is left.
        Wakes producers waiting for credit if anything was taken.
        """
        if self.discarded:
            return [], True
        count = self.num_put - self.num_taken  # counted, so no WouldBlock to catch
        if limit is not None and limit < count:
            count = limit
        items = self._receive(count)
        if items:
            self.took(count)
        return items, self._producers_open == 0 and self.num_put == self.num_taken

    def _send_all(self, items: Iterable[object]) -> int:
        """Append ``items``; the number appended."""
        batch = list(items)
        if not batch:
            return 0
        if self._closed:
            raise trio.ClosedResourceError(f"link {self.name!r} is closed")
        queued, capacity = self._items, self.capacity
        if len(batch) > capacity - len(queued):  # all or nothing: counts stay true
            raise trio.WouldBlock(f"link {self.name!r} is full ({capacity})")
        queued.extend(batch)
        return len(batch)

    def _receive(self, count: int) -> list[object]:
        popleft = self._items.popleft
        return [popleft() for _ in range(count)]

    def _close(self) -> None:
        self._closed = True

    def _drop(self) -> None:
        self._closed = True
        self._items.clear()

    def producer_done(self, *, wake: bool = True) -> None:
        """One producer will send no more; the last one closes the channel (EOF)."""
        if self._producers_open == 0:
            return
        self._producers_open -= 1
        if self._producers_open == 0:
            self._close()
            if wake:
                self._wake_consumer()

    def close_send(self) -> None:
        """End the channel now, whatever producers remain; buffered items stay readable."""
        self._producers_open = 0
        self._close()

    def discard(self) -> None:
        """Drop everything: close both ends; producers waiting for credit hear of it
        (the consumer let go itself, or its stream ended and it was told so)."""
        self._producers_open = 0
        self._drop()
        self.discarded = True
        self.wake_producers()

    def took(self, count: int) -> None:
        """The consumer took ``count`` items: credit is back for waiting producers."""
        self.num_taken += count
        if self._credit_waiters:
            self.wake_producers()

    def wait_for_credit(self, wakeup: Wakeup, need: int) -> None:
        """A producer skipped this link's stream for want of ``need`` units of credit:
        wake it once that much is free (and only then)."""
        self.stop_waiting(wakeup)
        self._credit_waiters.append((wakeup, need))

    def stop_waiting(self, wakeup: Wakeup) -> None:
        """The producer no longer waits for this link's credit (it planned the stream)."""
        self._credit_waiters = [w for w in self._credit_waiters if w[0] is not wakeup]

    def wake_producers(self) -> None:
        """Wake, in the order they began waiting, the producers that the credit free
        now covers; the others wait on (a registered producer has work for the stream,
        so a woken one takes its credit at its next plan)."""
        free = self.free
        waiting: list[tuple[Wakeup, int]] = []
        for wakeup, need in self._credit_waiters:
            if need <= free:
                free -= need
                wakeup.set()
            else:
                waiting.append((wakeup, need))
        self._credit_waiters = waiting

    def _wake_consumer(self) -> None:
        if self.consumer_wakeup is not None:
            self.consumer_wakeup.set()


class ClientLink(Link):
    """A stream's link to its client, which the client's task awaits (``receive``): the
    same deque as an edge's, and the one task waiting on it, if any, woken by a put (the
    item handed over as it comes), by the end, or by a discard. Not a trio memory
    channel: opening one was a quarter of a stream's admission on a cold path (~50 of
    ~175 us), and only one task ever waits here."""

    def __init__(self, name: str, capacity: int, num_producers: int = 1) -> None:
        super().__init__(name, capacity, num_producers)
        self._waiter: trio.lowlevel.Task | None = None

    async def receive(self) -> object:
        """The next item: waits for one. Raises ``trio.EndOfChannel`` once the producers
        are done and every item was taken, ``trio.ClosedResourceError`` once discarded.
        Cancellable; a cancelled call takes no item (as a trio channel's ``receive``)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.discarded:
            raise trio.ClosedResourceError(f"link {self.name!r} is closed")
        if self._items:
            item = self._items.popleft()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return item
        if self._closed:
            raise trio.EndOfChannel
        if self._waiter is not None:
            raise trio.BusyResourceError(f"another task is receiving from {self.name!r}")
        self._waiter = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            self._waiter = None
            return trio.lowlevel.Abort.SUCCEEDED

        # each woken task carries its own item (or error): a second task that starts
        # waiting before the first has run cannot take the first one's
        return await trio.lowlevel.wait_task_rescheduled(abort)

    def _send_all(self, items: Iterable[object]) -> int:
        waiter = self._waiter
        if waiter is None:
            return super()._send_all(items)
        batch = list(items)  # the link is empty while a task waits on it
        if not batch:
            return 0
        if self._closed:
            raise trio.ClosedResourceError(f"link {self.name!r} is closed")
        if len(batch) > self.capacity:
            raise trio.WouldBlock(f"link {self.name!r} is full ({self.capacity})")
        self._waiter = None
        trio.lowlevel.reschedule(waiter, outcome.Value(batch[0]))
        self._items.extend(batch[1:])
        return len(batch)

    def _close(self) -> None:
        super()._close()
        self._wake_waiter(trio.EndOfChannel())

    def _drop(self) -> None:
        super()._drop()
        self._wake_waiter(trio.ClosedResourceError(f"link {self.name!r} is closed"))

    def _wake_waiter(self, error: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            trio.lowlevel.reschedule(waiter, outcome.Error(error))
