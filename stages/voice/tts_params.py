"""The TTS stage's params that shape its phrases and parts (tts.py), checked: a wrong
one is a ``ValueError`` naming it, raised when the stage is built, and by a config's
check (``omnitrio check-config``: the stage's ``step_limits``, ``check_params``)."""

from __future__ import annotations

from collections.abc import Mapping

from .tts_stream import MIN_PART_FRAMES

SECONDS = ("first_phrase_cut_s", "later_phrase_cut_s", "later_phrase_min_slack_s")
"""The params in seconds (null: off)."""


def check_params(params: Mapping[str, object]) -> None:
    """A config's TTS ``params`` (with the stage's defaults) as the stage checks them
    when it is built, or a ``ValueError`` naming the wrong one; a param in seconds
    that is not a number (``"0.75s"``, ``true``) is one too."""
    for name in SECONDS:
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{name} must be a number of seconds or null, got {value!r}")
    get = params.get
    check_parts(
        get("first_chunk_frames"),  # type: ignore[arg-type]
        get("max_part_frames"),  # type: ignore[arg-type]
        get("first_part_words"),  # type: ignore[arg-type]
        get("first_phrase_max_words", 24),  # type: ignore[arg-type]
        bool(get("first_part_pauses_answer", False)),
        get("first_phrase_cut_s"),  # type: ignore[arg-type]
    )
    check_cuts(
        params.get("first_phrase_boundary_min_words"),  # type: ignore[arg-type]
        params.get("first_phrase_max_words", 24),  # type: ignore[arg-type]
        params.get("later_phrase_cut_s"),  # type: ignore[arg-type]
        params.get("later_phrase_min_slack_s"),  # type: ignore[arg-type]
    )


def check_parts(
    first_chunk_frames: int | None,
    max_part_frames: int | None,
    first_part_words: int | None,
    first_phrase_max_words: int,
    first_part_pauses_answer: bool,
    first_phrase_cut_s: float | None,
) -> None:
    """The params that speak phrases in parts, or a ``ValueError`` naming the wrong one."""
    if first_chunk_frames is not None and first_chunk_frames < 1:
        raise ValueError(f"first_chunk_frames must be positive or null, got {first_chunk_frames}")
    if max_part_frames is not None and max_part_frames < MIN_PART_FRAMES:
        raise ValueError(
            f"max_part_frames must be at least {MIN_PART_FRAMES} or null, got {max_part_frames}"
        )
    if first_part_words is not None and (
        first_chunk_frames is None or not 2 <= first_part_words < first_phrase_max_words
    ):
        raise ValueError(
            "first_part_words needs first_chunk_frames and must be at least 2 and below"
            f" first_phrase_max_words ({first_phrase_max_words}), got {first_part_words}"
        )
    if first_part_pauses_answer and first_part_words is None:
        raise ValueError("first_part_pauses_answer needs first_part_words")
    if first_phrase_cut_s is not None and (first_part_words is None or not first_phrase_cut_s >= 0):
        raise ValueError(
            "first_phrase_cut_s needs first_part_words and must be at least 0,"
            f" got {first_phrase_cut_s}"
        )


def check_cuts(
    first_phrase_boundary_min_words: int | None,
    first_phrase_max_words: int,
    later_phrase_cut_s: float | None,
    later_phrase_min_slack_s: float | None = None,
) -> None:
    """The params that cut phrases (phrases.py, tts_schedule.py) or hold later ones
    back, or a ``ValueError`` naming the wrong one."""
    boundary_min = first_phrase_boundary_min_words
    if boundary_min is not None and not 2 <= boundary_min <= first_phrase_max_words:
        raise ValueError(
            "first_phrase_boundary_min_words must be at least 2 and at most"
            f" first_phrase_max_words ({first_phrase_max_words}), got {boundary_min}"
        )
    if later_phrase_cut_s is not None and not later_phrase_cut_s >= 0:
        raise ValueError(f"later_phrase_cut_s must be at least 0 or null, got {later_phrase_cut_s}")
    slack = later_phrase_min_slack_s
    if slack is not None and not slack >= 0:
        raise ValueError(f"later_phrase_min_slack_s must be at least 0 or null, got {slack}")
