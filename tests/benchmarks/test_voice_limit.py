"""benchmarks/voice_limit.py: the capped configs ``voice_latency.py --find-limit`` serves,
the answers live at once, and the limit read off the arms."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.voice_latency import Level, Turn
from benchmarks.voice_limit import (
    Arm,
    answers_at_once,
    limit,
    limit_report,
    parse_caps,
    server_args,
)
from omnitrio import load_config

REPO = Path(__file__).resolve().parents[2]
VOICE_CHAT = REPO / "configs" / "voice-chat.yaml"


def test_caps_are_whole_numbers_or_the_configs_own_admission() -> None:
    assert parse_caps("2, 3,cpu,cpu:0.5") == [(2, None), (3, None), (None, None), (None, 0.5)]
    for bad in ("0", "2.5", "max", "", "cpu:", "3:0.5"):
        with pytest.raises(ValueError, match="a cap is"):
            parse_caps(bad)


def test_a_capped_arm_serves_the_voice_chat_by_max_streams_alone_at_the_cap(
    tmp_path: Path,
) -> None:
    """The capped config admits by ``max_streams`` at the cap and keeps the rest (the
    wait, the stages); a client's share is the cap too (one client holds every
    conversation, and its default share is half of max_streams)."""
    own = load_config(VOICE_CHAT)
    assert own.pipeline.admission == "cpu"
    args = server_args(VOICE_CHAT, (3, None), tmp_path)
    assert args[2:] == ["--max-streams-per-client", "64"]
    capped = load_config(args[1])
    assert (capped.pipeline.max_streams, capped.pipeline.admission) == (3, "max_streams")
    assert capped.pipeline.admission_wait_s == own.pipeline.admission_wait_s
    assert capped.stages == own.stages
    own_args = server_args(VOICE_CHAT, (None, None), tmp_path)  # the same client share
    assert own_args == ["--config", str(VOICE_CHAT), "--max-streams-per-client", "64"]
    margin = load_config(server_args(VOICE_CHAT, (None, 0.5), tmp_path)[1])
    assert (margin.pipeline.admission, margin.pipeline.realtime_margin) == ("cpu", 0.5)
    assert margin.stages == own.stages


def _turn(first_audio: float, done: float, dry_s: float = 0.0) -> Turn:
    turn = Turn(0, "q", answer_audio_s=3.0, underrun_buffered_s=dry_s, status="completed")
    turn.end_of_speech_to_first_audio_s = 0.8
    turn.clock_s = {"stopped": first_audio - 0.8, "first_audio": first_audio, "done": done}
    return turn


def test_answers_at_once_counts_the_answers_making_audio_at_once() -> None:
    """From each answer's first audio to its response.done: a turn that waited for a
    slot after its speech_stopped is not counted while it waited."""
    turns = [_turn(1, 5), _turn(2, 3), _turn(3, 6), _turn(3, 4), _turn(6, 9)]
    assert answers_at_once(turns) == 3  # 1-5, 3-6 and 3-4 (2-3 ended at 3)
    assert answers_at_once([_turn(1, 5), _turn(5.5, 8)]) == 1  # stopped at 4.7, first audio 5.5
    refused = Turn(0, "q", status="failed", retry_after_ms=400)
    refused.clock_s = {"stopped": 2.5, "done": 2.6}
    assert answers_at_once([*turns, refused]) == 3  # a refused turn is no answer


def _arm(cap: int | None, dry: int, at_once: int | None = None) -> Arm:
    """Four conversations; ``at_once`` answers making audio at once (default: the cap)."""
    level = Level(4, wall_s=60.0, others_cpu_s=1.2, load_average=(1.0, 2.0))
    level.turns = [_turn(i * 4, i * 4 + 3, 0.5 if i < dry else 0.0) for i in range(5)]
    level.turns += [_turn(0.5, 2.5) for _ in range((at_once or cap or 1) - 1)]
    level.turns.append(Turn(0, "q", status="failed", retry_after_ms=300))
    return Arm(cap, level)


def test_the_limit_is_the_largest_cap_whose_runs_kept_every_answer_and_none_below_ran_dry() -> None:
    assert limit([_arm(2, 0), _arm(3, 0), _arm(None, 2), _arm(3, 1)]) == 2  # 3 ran one dry once
    assert limit([_arm(2, 0), _arm(3, 0), _arm(4, 0)]) == 3  # 4 of 4 conversations: no cap
    assert limit([_arm(2, 0), _arm(3, 0, at_once=2)]) == 2  # 3 never had 3 answers at once
    assert limit([_arm(2, 1), _arm(3, 0)]) is None  # 2 ran one dry: 3's clean run is luck
    assert "the limit's runs" not in limit_report([_arm(2, 1), _arm(None, 1)])
    report = limit_report([_arm(2, 0), _arm(None, 1)])
    assert "| max_streams 2 | 4 | 6 / 1 (1) | 2 | 800 | 0 (0.00) | 0 (0.00) | yes | 0.02" in report
    assert "Limit: 2 answers at once" in report
    assert "cpu: answered 5 of 6 turns, at most 1 at once (limit 2), 1 dry" in report
