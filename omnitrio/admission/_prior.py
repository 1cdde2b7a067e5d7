"""What a stage declares one step costs and yields: headroom's prior for a first wave.

A closed loop's first wave arrives before any stage has taken a step, so the stages'
step-time models (``_headroom.py``) have nothing measured to judge it by, and it used
to be admitted blind, up to ``max_streams``: past the real-time limit wherever that
lies below the cap (``bench-qwen3-omni.yaml``: 224 admitted, 192 keep real time).
A stage class may declare, for a config's params, what one step costs and what it
yields (a classmethod ``step_cost(params) -> StepCost | None``, as ``step_limits``),
and the pipeline composes the chain's declarations into each stage's prior
(``declared_priors``): a step of ``b`` streams takes ``step_s + per_stream_s x b``,
and yields the audio its outputs become downstream. Each stage's audio per
stream-step is its own audio plus its outputs times the audio an item becomes at
the stage after (that stage's steps per input times its yield), from the last stage
back; a stage before one that declares nothing gets no prior. The model uses the
prior only until it has measured the stage (``StepModel.prior``), and charges it
``PRIOR_SLACK`` more than declared: a declaration is the stage's own work, not what
the stages do to one another on shared cores (GIL hand-offs, late wake-ups), which
made ``bench-qwen3-omni.yaml``'s talker measure 2-6 % slower than its profile.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .._config import PipelineConfig, resolve_impl, stage_params
from .._errors import ConfigError
from ._headroom import StepPrior

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one step of a stage costs and yields, as its class declares it for a
    config's params (``step_cost(params)``). A source stage's ``steps_per_input`` is
    not used; a stage that makes no audio itself declares ``audio_s_per_step`` 0."""

    step_s: float
    """A step's fixed time, whatever its batch (seconds)."""
    per_stream_s: float
    """Added per stream in the batch (seconds)."""
    steps_per_input: float = 1.0
    """Steps one stream takes here per item from the stage before (a talker's codec
    frames per text token; a vocoder's 1 / its window)."""
    outputs_per_step: float = 1.0
    """Items one stream-step sends the stage after."""
    audio_s_per_step: float = 0.0
    """Audio one stream-step sends the client (seconds)."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"StepCost.{field.name} must be a number, not {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"StepCost.{field.name} must be finite and >= 0, not {value!r}")
        if self.steps_per_input <= 0:
            raise ValueError(
                f"StepCost.steps_per_input must be above 0, not {self.steps_per_input}"
            )


def compose(costs: Sequence[StepCost | None]) -> list[StepPrior | None]:
    """The chain's priors from its stages' declarations (in chain order): each stage's
    yield is its own audio plus its outputs times the audio an item becomes at the
    stage after, from the last back; None for a stage that declares nothing, or one
    before such a stage, or one that yields no audio."""
    priors: list[StepPrior | None] = []
    audio_per_item_s: float | None = 0.0  # what an item sent past the last stage becomes
    for cost in reversed(costs):
        if cost is None or audio_per_item_s is None:
            audio_per_item_s = None
            priors.append(None)
            continue
        yield_s = cost.audio_s_per_step + cost.outputs_per_step * audio_per_item_s
        priors.append(StepPrior(cost.step_s, cost.per_stream_s, yield_s) if yield_s > 0 else None)
        audio_per_item_s = cost.steps_per_input * yield_s
    return priors[::-1]


def declared_cost(factory: Any, params: Mapping[str, Any]) -> StepCost | None:
    """What ``factory`` (a stage class) declares for ``params`` (None: nothing).
    Raises ``TypeError`` if its ``step_cost`` returns something else."""
    step_cost = getattr(factory, "step_cost", None)
    if not callable(step_cost):
        return None
    cost = step_cost(params)
    if cost is not None and not isinstance(cost, StepCost):
        name = getattr(factory, "__qualname__", factory)
        raise TypeError(f"{name}.step_cost returned a {type(cost).__name__}, not a StepCost")
    return cost


def declared_priors(config: PipelineConfig) -> dict[str, StepPrior]:
    """Each chain stage's prior, by name, from what its class declares (``compose``).
    Raises ``ConfigError`` naming the stage if its ``step_cost`` refuses its params or
    returns something other than a ``StepCost``."""
    costs = []
    for spec in config.stages:
        factory = resolve_impl(spec.impl, config.source, f"stage {spec.name}.impl")
        try:
            costs.append(declared_cost(factory, stage_params(spec, factory)))
        except Exception as exc:
            raise ConfigError(
                config.source,
                f"stage {spec.name}.params",
                f"step_cost: {type(exc).__name__}: {exc}; fix the value or the stage",
            ) from None
    priors = compose(costs)
    named = {s.name: p for s, p in zip(config.stages, priors, strict=True) if p is not None}
    if named:
        logger.info("headroom's first-wave priors: %s", named)
    return named
