"""Links and wake-ups, on virtual time (no threads involved)."""

import pytest
import trio
import trio.testing

from omnitrio._link import ClientLink, Link, Wakeup


async def test_wakeup_is_level_triggered_and_consumed() -> None:
    wakeup = Wakeup()
    wakeup.set()
    wakeup.set()
    with trio.fail_after(1):
        await wakeup.wait()  # the pending wake-up returns at once
    woke = False

    async def waiter() -> None:
        nonlocal woke
        await wakeup.wait()
        woke = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not woke  # consumed: the second wait blocks
        wakeup.set()
    assert woke


async def test_credit_counts_buffered_and_reserved_items() -> None:
    link = Link("a->b", capacity=4)
    assert link.free == 4
    link.reserve(2)
    assert link.free == 2
    link.put(["x", "y"])
    link.settle(2, used=2)
    assert (link.buffered, link.free) == (2, 2)
    items, closed = link.take(limit=1)
    assert (items, closed, link.free) == (["x"], False, 3)


async def test_put_wakes_the_consumer_and_take_wakes_producers() -> None:
    link = Link("a->b", capacity=2)
    link.consumer_wakeup, producer = Wakeup(), Wakeup()
    link.wait_for_credit(producer, 1)  # it skipped this stream for want of credit
    link.put(["x"])
    with trio.fail_after(1):
        await link.consumer_wakeup.wait()
    link.take(limit=None)
    with trio.fail_after(1):
        await producer.wait()
    # Woken once: a later take wakes only producers that asked again.
    link.put(["y"])
    link.take(limit=None)
    assert not producer.consume()


async def test_end_of_input_after_the_last_producer_is_done() -> None:
    link = Link("client", capacity=4, num_producers=2)
    link.put(["x"])
    link.producer_done()
    assert not link.producers_done
    link.producer_done()
    assert link.producers_done
    assert link.take(limit=None) == (["x"], True)


async def test_a_discarded_link_drops_puts_and_never_holds_a_producer_back() -> None:
    link = Link("a->b", capacity=1)
    link.put(["x"])
    link.discard()
    link.put(["y"])  # no error: its stream has ended
    assert link.free == 1


async def test_take_up_to_the_last_item_reports_the_end() -> None:
    link = Link("a->b", capacity=4)
    link.put(["x", "y"])
    link.producer_done()
    assert link.take(limit=2) == (["x", "y"], True)


async def test_unused_reservation_wakes_the_producers() -> None:
    link = Link("client", capacity=1, num_producers=2)
    other = Wakeup()
    link.wait_for_credit(other, 1)
    link.reserve(1)
    link.settle(1, used=0)
    with trio.fail_after(1):
        await other.wait()


async def test_an_edge_link_is_a_bounded_deque_and_the_client_link_one_the_client_awaits() -> None:
    edge = Link("a->b", capacity=2)
    assert not hasattr(edge, "receive_channel")  # nothing awaits an edge: no trio channel
    edge.put(["x", "y"])
    with pytest.raises(trio.WouldBlock):  # past its capacity, as a full channel would
        edge.put(["z"])
    assert edge.take(limit=None) == (["x", "y"], False)
    edge.producer_done()
    with pytest.raises(trio.ClosedResourceError):  # no put after the last producer
        edge.put(["z"])
    client = ClientLink("client", capacity=1)
    client.put(["x"])
    with trio.fail_after(1):
        assert await client.receive() == "x"
    client.took(1)
    client.discard()
    with pytest.raises(trio.ClosedResourceError):  # a discarded client link wakes a reader
        await client.receive()


async def test_a_client_links_waiting_reader_is_woken_by_a_put_the_end_or_a_discard() -> None:
    got: list[object] = []

    async def read(link: ClientLink) -> None:
        try:
            got.append(await link.receive())
        except (trio.EndOfChannel, trio.ClosedResourceError) as exc:
            got.append(type(exc))

    for wake, expected in [
        (lambda link: link.put(["x", "y"]), "x"),
        (lambda link: link.producer_done(), trio.EndOfChannel),
        (lambda link: link.discard(), trio.ClosedResourceError),
    ]:
        client = ClientLink("client", capacity=2)
        got.clear()
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, client)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []  # it waits: nothing was put
                wake(client)
        assert got == [expected]
    assert client.buffered == 0  # the discarded one
    client = ClientLink("client", capacity=2)
    client.put(["x", "y"])  # an item handed over, the next one queued
    assert await client.receive() == "x"
    assert await client.receive() == "y"


async def test_a_cancelled_receive_on_a_client_link_takes_no_item() -> None:
    client = ClientLink("client", capacity=2)
    with trio.move_on_after(0.01) as waited:
        await client.receive()  # nothing yet: cancelled while it waits
    assert waited.cancelled_caught
    client.put(["x"])  # not handed to the cancelled reader
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await client.receive()  # cancelled before it looks: the item stays
    assert await client.receive() == "x"


async def test_a_reader_that_waits_before_a_woken_one_has_run_takes_nothing_of_its() -> None:
    """A put hands its item to the waiting reader; before that reader has run, a second
    one may start to wait and be woken by the end. Each keeps what it was woken with:
    the first its item, the second the end (trio runs a batch of woken tasks in either
    order, so the second's wake-up comes first half the time)."""

    async def read(client: ClientLink, got: list[object]) -> None:
        try:
            got.append(await client.receive())
        except trio.EndOfChannel:
            got.append("end")

    async def end(client: ClientLink) -> None:
        client.producer_done()

    for _ in range(40):
        client = ClientLink("client", capacity=2)
        got: list[object] = []
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, client, got)
                await trio.testing.wait_all_tasks_blocked()
                client.put(["x"])  # the first reader woken, not yet run
                nursery.start_soon(end, client)  # may run before either reader
                nursery.start_soon(read, client, got)
        assert sorted(map(str, got)) == ["end", "x"]
