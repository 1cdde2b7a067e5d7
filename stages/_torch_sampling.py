"""Per-stream sampling: parameters from ``Request.options`` and one pick per row.

Options are read as ``<stage>.<key>`` first, then (where the stage inherits)
``<key>``: ``talker.temperature`` sets the talker's only. ``temperature`` 0 is
greedy. The logits processors are transformers' own, applied in ``generate``'s
order (repetition penalty, suppressed ids, then temperature, top-k, top-p), so a
greedy pick equals ``generate``'s. A stream may add a ``constraint`` (a grammar,
see ``_grammar.py``): it masks the scores after the suppressed ids and before
the warpers, and hears each picked token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omnitrio import ResponseOptions

if TYPE_CHECKING:
    from stages._grammar import Constraint

_KINDS = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "repetition_penalty": float,
    "max_tokens": int,
    "seed": int,
}
_SHARED: dict[str, Callable[[ResponseOptions], float | int | None]] = {
    "temperature": lambda options: options.temperature,
    "top_p": lambda options: options.top_p,
    "max_tokens": lambda options: options.max_tokens,
    "seed": lambda options: options.seed,
}
"""The sampling keys that are response options; the rest are knobs (``top_k``...)."""


class OptionError(ValueError):
    """A request option has the wrong type or range; the message names the option."""


class SamplingError(RuntimeError):
    """One stream's scores could not be sampled (not numbers, or nothing allowed)."""


SEED_RANGE = (-(2**63), 2**64 - 1)
"""What ``torch.Generator.manual_seed`` takes."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    seed: int | None = None  # None: a fresh random seed per stream

    @classmethod
    def from_options(
        cls,
        defaults: SamplingParams,
        options: ResponseOptions,
        stage: str,
        *,
        inherit: bool = True,
    ) -> SamplingParams:
        """``defaults`` overridden by the knob ``<stage>.<key>`` (and, if ``inherit``, by
        the response option ``<key>``, or for ``top_k`` and ``repetition_penalty`` the
        knob ``<key>``)."""
        values: dict[str, float | int] = {}
        for key, kind in _KINDS.items():
            name = f"{stage}.{key}"
            raw: object = options.knobs.get(name)
            if raw is None and inherit:
                name = key
                shared = _SHARED.get(key)
                raw = shared(options) if shared is not None else options.knobs.get(key)
            if raw is None:
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise OptionError(f"option {name!r} must be a number, not {raw!r}")
            if kind is int and raw != int(raw):
                raise OptionError(f"option {name!r} must be a whole number, not {raw!r}")
            values[key] = kind(raw)
        params = replace(defaults, **values)  # type: ignore[arg-type]
        params.check(stage)
        return params

    def check(self, stage: str = "") -> None:
        rules = (
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0"),
            ("max_tokens", self.max_tokens >= 1, ">= 1"),
            (
                "seed",
                self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1],
                "a 64-bit integer",
            ),
        )
        for key, ok, rule in rules:
            if not ok:
                raise OptionError(
                    f"option {key!r} ({stage}) must be {rule}, not {getattr(self, key)!r:.40}"
                )


class Sampler:
    """One stream's sampler: its parameters, its seeded generator, its token history."""

    def __init__(
        self,
        params: SamplingParams,
        history: Sequence[int] = (),
        suppress: Sequence[int] = (),
        *,
        constraint: Constraint | None = None,
    ) -> None:
        self.params = params
        self.constraint = constraint
        # What the repetition penalty looks at (the prompt too, where generate includes it).
        self.history = list(history) if params.repetition_penalty != 1.0 else []
        self._suppress = list(suppress)
        self._generator = torch.Generator()
        self._generator.manual_seed(params.seed if params.seed is not None else torch.seed())
        self._penalty = (
            RepetitionPenaltyLogitsProcessor(params.repetition_penalty)
            if params.repetition_penalty != 1.0
            else None
        )
        self._warpers: list[object] = []
        if params.temperature > 0:
            self._warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                self._warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                self._warpers.append(TopPLogitsWarper(params.top_p))

    def pick(self, logits: torch.Tensor) -> int:
        """logits: [V] for one position (any device) -> the next token."""
        scores = logits.float().cpu()[None, :]  # [1, V]
        ids = torch.tensor([self.history], dtype=torch.long)  # [1, n]
        if self._penalty is not None:
            scores = self._penalty(ids, scores)
        if self._suppress:
            scores = scores.clone()
            scores[:, self._suppress] = -float("inf")
        if self.constraint is not None:
            scores = self.constraint.mask(scores)
        if not self._warpers:
            token = int(torch.argmax(scores, dim=-1))
        else:
            for warper in self._warpers:
                scores = warper(ids, scores)  # type: ignore[operator]
            probs = torch.softmax(scores, dim=-1)
            try:
                token = int(torch.multinomial(probs, 1, generator=self._generator))
            except RuntimeError as exc:  # inf, nan or no token left to draw
                raise SamplingError(f"cannot sample the next token: {exc}") from None
        if self._penalty is not None:
            self.history.append(token)
        if self.constraint is not None:
            self.constraint.advance(token)
        return token
