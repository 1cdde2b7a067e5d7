from omnitrio._scheduler import Candidate, pick_batch


def c(sid: str, *, work: bool = True, fits: bool = True, last: int = -1) -> Candidate:
    return Candidate(sid, work, fits, last)


def test_picks_only_streams_with_work_that_fit() -> None:
    decision = pick_batch([c("a"), c("b", work=False), c("c", fits=False), c("d")], 8)
    assert decision.batch == ("a", "d")
    assert decision.num_skipped_no_credit == 1


def test_least_recently_stepped_first_up_to_the_batch_limit() -> None:
    decision = pick_batch([c("a", last=5), c("b", last=2), c("c", last=9), c("d", last=-1)], 2)
    assert decision.batch == ("d", "b")


def test_a_full_stream_never_takes_a_batch_slot() -> None:
    # Many full streams ahead in line must not starve the one that fits.
    full = [c(f"full{i}", fits=False, last=-1) for i in range(100)]
    decision = pick_batch([*full, c("ok", last=50)], 1)
    assert decision.batch == ("ok",)
    assert decision.num_skipped_no_credit == 100


def test_nothing_ready_is_an_empty_batch() -> None:
    assert pick_batch([c("a", work=False)], 4).batch == ()
