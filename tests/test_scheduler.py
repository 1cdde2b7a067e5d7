from omnitrio._scheduler import Candidate, pick_batch


def c(sid: str, *, work: bool = True, fits: bool = True) -> Candidate:
    return Candidate(sid, work, fits)


def test_picks_only_streams_with_work_that_fit() -> None:
    decision = pick_batch([c("a"), c("b", work=False), c("c", fits=False), c("d")], 8)
    assert decision.batch == ("a", "d")
    assert decision.skipped == ("c",)


def test_keeps_the_given_order_up_to_the_batch_limit() -> None:
    decision = pick_batch([c("d"), c("b"), c("a"), c("c")], 2)
    assert decision.batch == ("d", "b")


def test_a_full_stream_never_takes_a_batch_slot() -> None:
    # Many full streams ahead in line must not starve the one that fits.
    full = [c(f"full{i}", fits=False) for i in range(100)]
    decision = pick_batch([*full, c("ok")], 1)
    assert decision.batch == ("ok",)
    assert len(decision.skipped) == 100


def test_stops_reading_candidates_once_the_batch_is_full() -> None:
    seen: list[int] = []

    def candidates():  # type: ignore[no-untyped-def]
        for i in range(1000):
            seen.append(i)
            yield c(str(i))

    assert pick_batch(candidates(), 3).batch == ("0", "1", "2")
    assert seen == [0, 1, 2]


def test_nothing_ready_is_an_empty_batch() -> None:
    assert pick_batch([c("a", work=False)], 4).batch == ()
