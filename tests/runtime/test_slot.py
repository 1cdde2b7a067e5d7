"""The per-stream state machine of a stage actor (``omnitrio/_slot.py``)."""

from __future__ import annotations

import pytest

from omnitrio._slot import TRANSITIONS, Event, IllegalTransition, Phase, Slot


class _Stream:
    id = "s0"


def slot() -> Slot:
    return Slot(_Stream(), None, None)  # type: ignore[arg-type]  # only .id is read


def walk(*events: Event) -> Phase:
    s = slot()
    for event in events:
        s.on(event)
    return s.phase


def test_a_stream_that_finishes_is_opened_closed_and_released() -> None:
    assert walk(Event.PLAN_OPEN, Event.OPENED, Event.CLOSED, Event.RELEASE) is Phase.RELEASED


def test_an_ended_stream_is_closed_on_the_stage_before_it_is_released() -> None:
    s = slot()
    s.on(Event.PLAN_OPEN)
    s.on(Event.OPENED)
    assert s.on(Event.END) is Phase.ENDING
    with pytest.raises(IllegalTransition):
        s.on(Event.RELEASE)  # the stage still holds it
    assert s.on(Event.PLAN_CLOSE) is Phase.CLOSING
    assert s.on(Event.CLOSED) is Phase.CLOSED
    assert s.on(Event.RELEASE) is Phase.RELEASED


def test_a_stream_that_ends_before_its_open_is_planned_is_never_opened() -> None:
    assert walk(Event.END) is Phase.CLOSED
    with pytest.raises(IllegalTransition):
        walk(Event.END, Event.PLAN_OPEN)


def test_a_stream_that_ends_while_its_open_is_out_is_closed_once_it_is_back() -> None:
    assert walk(Event.PLAN_OPEN, Event.END, Event.OPENED) is Phase.ENDING
    assert walk(Event.PLAN_OPEN, Event.END, Event.OPEN_FAILED) is Phase.CLOSED


def test_release_only_from_closed_and_only_once_no_round_holds_it() -> None:
    for phase in Phase:
        legal = (phase, Event.RELEASE) in TRANSITIONS
        assert legal == (phase is Phase.CLOSED)
    s = slot()
    s.on(Event.END)
    s.in_flight = 1
    assert not s.releasable
    s.in_flight = 0
    assert s.releasable


def test_abandon_frees_from_any_phase_but_released() -> None:
    for phase in Phase:
        assert ((phase, Event.ABANDON) in TRANSITIONS) == (phase is not Phase.RELEASED)


def test_an_illegal_event_names_the_stream_event_and_phase() -> None:
    with pytest.raises(IllegalTransition, match=r"s0.*opened in phase new"):
        walk(Event.OPENED)
