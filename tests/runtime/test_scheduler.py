from omnitrio._scheduler import Candidate, Playback, displaced, pick_batch


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


def d(sid: str, deadline_s: float, *, fits: bool = True) -> Candidate:
    return Candidate(sid, True, fits, deadline_s)


def test_deadline_a_full_batch_takes_the_earliest_deadlines_in_the_given_order() -> None:
    # "ahead" is far ahead of its deadline: it gives its place to the streams behind.
    candidates = [d("ahead", 9.0), d("late", 1.0), d("full", 0.0, fits=False), d("soon", 2.0)]
    decision = pick_batch(candidates, 2, "deadline")
    assert decision.batch == ("late", "soon")
    assert decision.skipped == ("full",)


def test_deadline_ties_keep_the_given_order_and_a_batch_with_room_takes_all() -> None:
    assert pick_batch([d("b", 1.0), d("a", 1.0), d("c", 1.0)], 2, "deadline").batch == ("b", "a")
    assert pick_batch([d("b", 5.0), d("a", 1.0)], 8, "deadline").batch == ("b", "a")


def test_playback_deadline_is_first_audio_plus_audio_less_the_buffer() -> None:
    playback = Playback(client_buffer_s=0.25, first_audio_budget_s=1.0)
    assert playback.deadline_s(10.0, None, 0.0) == 11.0  # before its first audio: the budget
    assert playback.deadline_s(10.0, 10.5, 2.0) == 10.5 + 2.0 - 0.25
    # streams with no audio (text-only) are ordered by age
    assert playback.deadline_s(1.0, None, 0.0) < playback.deadline_s(2.0, None, 0.0)


def test_deadline_a_first_step_comes_before_any_deadline() -> None:
    # A newcomer's first step at the stage is the most urgent there is: its client waits
    # for its first item, behind nobody's backlog, whatever the batch size.
    late = d("late", 1.0)
    newcomer = Candidate("new", True, True, 50.0, first=True)
    assert pick_batch([late, newcomer], 1, "deadline", now_s=10.0).batch == ("new",)
    assert pick_batch([late, newcomer], 2, "deadline", now_s=10.0).batch == ("late", "new")


def test_deadline_late_streams_share_the_steps_instead_of_the_latest_taking_all() -> None:
    # Past deadlines count as now: the latest stream gains nothing by being later, so
    # late streams keep the given order (least recently stepped first) among themselves.
    candidates = [d("b", 3.0), d("a", 1.0), d("ahead", 20.0)]
    assert pick_batch(candidates, 1, "deadline", now_s=10.0).batch == ("b",)
    assert pick_batch(candidates, 2, "deadline", now_s=10.0).batch == ("b", "a")
    # Before they are late, the earlier deadline goes first.
    assert pick_batch(candidates, 1, "deadline", now_s=0.0).batch == ("a",)


def test_a_newcomer_displaces_the_least_urgent_that_is_not_on_its_first_step() -> None:
    # A full queued batch makes room for a newcomer's first step: the stream with the
    # latest deadline gives its place (of late ones, which all count as now, the last
    # given, the most recently stepped); another newcomer never does.
    batch = [d("late", 1.0), d("ahead", 30.0), Candidate("new", True, True, 99.0, first=True)]
    assert displaced(batch, now_s=10.0) == 1
    assert displaced([d("x", 1.0), d("y", 2.0)], now_s=10.0) == 1
    assert displaced([Candidate("new", True, True, 5.0, first=True)], now_s=10.0) is None
