"""Per-stream sampling: each stream has its own parameters and random generator.

The logits processors are transformers' own, applied in the order ``generate``
applies them (repetition penalty, suppressed ids, then temperature, top-k, top-p
when sampling), so a greedy stream picks exactly what ``generate`` picks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

Scalar = str | int | float | bool | None


class OptionError(ValueError):
    """A request option has the wrong type or range."""


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    seed: int | None = None

    @classmethod
    def from_options(
        cls, options: Mapping[str, Scalar], *, prefix: str = "", defaults: SamplingParams
    ) -> SamplingParams:
        """Read ``{prefix}temperature`` ... from a request's options over ``defaults``."""
        values = {}
        for name, kind in (
            ("temperature", float),
            ("top_p", float),
            ("top_k", int),
            ("repetition_penalty", float),
            ("max_tokens", int),
            ("seed", int),
        ):
            key = prefix + name
            if key not in options or options[key] is None:
                continue
            value = options[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise OptionError(f"option {key!r} must be a number, not {value!r}")
            if kind is int and value != int(value):
                raise OptionError(f"option {key!r} must be a whole number, not {value!r}")
            values[name] = kind(value)
        params = SamplingParams(**{**defaults.__dict__, **values})
        params.check(prefix)
        return params

    def check(self, prefix: str = "") -> None:
        rules = (
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0"),
            ("max_tokens", self.max_tokens >= 1, ">= 1"),
        )
        for name, ok, rule in rules:
            if not ok:
                raise OptionError(
                    f"option {prefix + name!r} must be {rule}, not {getattr(self, name)!r}"
                )


class Sampler:
    """Picks one stream's next token from its logits row."""

    def __init__(self, params: SamplingParams, *, suppress_ids: Sequence[int] = ()) -> None:
        self.params = params
        processors = LogitsProcessorList()
        if params.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if suppress_ids:
            processors.append(SuppressTokensLogitsProcessor(list(suppress_ids), device="cpu"))
        if params.temperature > 0:
            processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        self._processors = processors
        self._generator = torch.Generator()
        self._generator.manual_seed(params.seed if params.seed is not None else torch.seed())

    def sample(self, logits: torch.Tensor, history: torch.Tensor) -> int:
        """``logits``: [vocab] for one position; ``history``: [n] ids generated so far."""
        scores = self._processors(history.view(1, -1), logits.view(1, -1).float().cpu())  # [1, V]
        if self.params.temperature == 0:
            return int(scores.argmax(dim=-1))
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator))
