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


async def test_an_edge_link_is_a_bounded_deque_and_the_client_link_a_trio_channel() -> None:
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
        assert await client.receive_channel.receive() == "x"
    client.took(1)
    client.discard()
    with pytest.raises(trio.ClosedResourceError):  # a discarded client link wakes a reader
        await client.receive_channel.receive()
