"""The LLM stage's ``first_audio_*`` params (first_audio.py), checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .first_audio import FirstAudio


@dataclass(frozen=True)
class FirstAudioParams:
    """The LLM stage's ``first_audio_*`` params, checked: a param that acts only with
    another (``from_asr`` with ``first``, ``through_first_phrase`` with ``from_asr``,
    ``min_slack_s`` with ``first``) set while that one is off is refused naming both,
    not ignored (the LLM stage's ``step_limits`` checks them, so a config's check does)."""

    first: bool = False
    from_asr: bool = False
    min_slack_s: float | None = None
    through_first_phrase: bool = False

    @classmethod
    def of(cls, params: Mapping[str, object]) -> FirstAudioParams:
        """The ``first_audio_*`` params of a stage's ``params`` (defaults where absent)."""
        slack = params.get("first_audio_min_slack_s")
        return cls(
            bool(params.get("first_audio_first", False)),
            bool(params.get("first_audio_from_asr", False)),
            None if slack is None else float(slack),  # type: ignore[arg-type]
            bool(params.get("first_audio_through_first_phrase", False)),
        )

    def __post_init__(self) -> None:
        slack = self.min_slack_s
        if slack is not None and not slack >= 0:
            raise ValueError(f"first_audio_min_slack_s must be at least 0 or null, got {slack}")
        needs = (
            ("first_audio_from_asr", self.from_asr, "first_audio_first", self.first),
            ("first_audio_min_slack_s", slack is not None, "first_audio_first", self.first),
            (
                "first_audio_through_first_phrase",
                self.through_first_phrase,
                "first_audio_from_asr",
                self.from_asr,
            ),
        )
        for param, is_set, needed, on in needs:
            if is_set and not on:
                raise ValueError(
                    f"{param} acts only with {needed}, which is off"
                    f" (set {needed}: true, or leave {param} out)"
                )

    def apply(self, gate: FirstAudio) -> None:
        """Set ``gate`` (the process's ``FIRST_AUDIO``) to these params."""
        gate.hold_for_starting = self.first and self.from_asr
        gate.min_slack_s = self.min_slack_s
        gate.through_first_phrase = gate.hold_for_starting and self.through_first_phrase
