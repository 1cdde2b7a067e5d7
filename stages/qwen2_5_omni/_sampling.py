"""Per-stream sampling: parameters from ``Request.options`` and one pick per row.

Options are read as ``<stage>.<key>`` first, then ``<key>`` (``talker.temperature``
overrides ``temperature`` for the talker only). ``temperature`` 0 is greedy. The
logits processors are transformers' own, applied in ``generate``'s order, so a
greedy pick equals ``generate``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    seed: int = 0

    @classmethod
    def from_options(
        cls, defaults: SamplingParams, options: Mapping[str, object], stage: str
    ) -> SamplingParams:
        values: dict[str, float | int] = {}
        for key in ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed"):
            raw = options.get(f"{stage}.{key}", options.get(key))
            if raw is None:
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise ValueError(f"option {key} must be a number, not {raw!r}")
            kind = int if key in ("top_k", "max_tokens", "seed") else float
            values[key] = kind(raw)
        params = replace(defaults, **values)  # type: ignore[arg-type]
        params.check()
        return params

    def check(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"bad sampling parameters {self}")
        if self.repetition_penalty <= 0 or self.max_tokens < 1:
            raise ValueError(f"bad sampling parameters {self}")


class Sampler:
    """One stream's sampler: its parameters, its seeded generator, its token history."""

    def __init__(
        self, params: SamplingParams, history: Sequence[int], suppress: Sequence[int] = ()
    ) -> None:
        self.params = params
        self.history = list(history)  # what repetition penalty looks at (prompt included)
        self._suppress = list(suppress)
        self._generator = torch.Generator().manual_seed(params.seed)
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
        """logits: [V] float32 -> the next token (appended to the history)."""
        scores = logits[None, :]  # [1, V]
        if self._penalty is not None:
            ids = torch.tensor([self.history], dtype=torch.long)
            scores = self._penalty(ids, scores)
        if self._suppress:
            scores = scores.clone()
            scores[:, self._suppress] = -float("inf")
        if not self._warpers:
            token = int(torch.argmax(scores, dim=-1))
        else:
            ids = torch.tensor([self.history], dtype=torch.long)
            for warper in self._warpers:
                scores = warper(ids, scores)  # type: ignore[operator]
            probs = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=self._generator))
        self.history.append(token)
        return token
