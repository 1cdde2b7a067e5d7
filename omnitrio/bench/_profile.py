"""What a synthetic pipeline *should* do with zero runtime overhead.

When every stage of a config is ``stages.synthetic:SyntheticStage``, its service
times are known, so the benchmark can say what the stages alone cost:

- ``ideal_first_audio_s``: streams started together on an idle pipeline, each
  stage stepping the moment its input is there (a discrete-event walk of the
  chain). Measured TTFA minus this is the *runtime-added* TTFA.
- ``capacity_requests_per_s``: the bottleneck stage's rate with full batches,
  prefill counted (one batched prefill per batch of new requests, as streams
  started together in a closed loop have).
- ``open_loop_capacity_requests_per_s``: the same with one prefill per arrival,
  as the stage charges it when requests arrive one at a time (Poisson).
- ``max_continuous_streams``: the most concurrent streams for which every
  stage still keeps up with real-time audio (beyond it, underruns are the
  stages' doing, not the runtime's).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._config import PipelineConfig, resolve_impl

SYNTHETIC_IMPL = "stages.synthetic:SyntheticStage"


@dataclass(frozen=True)
class StageProfile:
    name: str
    step_s: float  # service time of one step, whatever the batch
    per_stream_s: float  # added per stream in the batch
    prefill_s: float  # added to a stream's first step (source mode)
    prefill_per_word_s: float  # and this per word of its prompt
    steps: int | None  # units per stream at a source stage
    inputs_per_step: int
    outputs_per_input: int
    visible_every: int
    audio_s_per_visible: float | None  # None when its visible items are not audio
    max_batch_size: int


def synthetic_profiles(config: PipelineConfig) -> list[StageProfile] | None:
    """The chain's profiles, or None unless every stage is a ``SyntheticStage``."""
    profiles = []
    for spec in config.stages:
        if spec.impl != SYNTHETIC_IMPL:
            return None
        defaults = {
            name: p.default
            for name, p in inspect.signature(
                resolve_impl(spec.impl, config.source, "impl")
            ).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        params: dict[str, Any] = {**defaults, **spec.params}
        audio = params["visible"] == "audio" and params["visible_every"]
        profiles.append(
            StageProfile(
                name=spec.name,
                step_s=params["service_time_ms"] / 1000,
                per_stream_s=params["per_stream_ms"] / 1000,
                prefill_s=params["prefill_ms"] / 1000,
                prefill_per_word_s=params["prefill_ms_per_word"] / 1000,
                steps=params["steps"],
                inputs_per_step=params["inputs_per_step"],
                outputs_per_input=params["outputs_per_input"],
                visible_every=params["visible_every"],
                audio_s_per_visible=(
                    params["audio_samples"] / params["sample_rate_hz"] if audio else None
                ),
                max_batch_size=spec.max_batch_size,
            )
        )
    return profiles


def ideal_first_audio_s(
    profiles: Sequence[StageProfile], steps: int, num_words: int = 0, streams: int = 1
) -> float | None:
    """When the first audio chunk leaves the first audio stage with no runtime overhead.

    ``streams`` streams of ``steps`` units and ``num_words``-word prompts start
    together and move in lockstep: each stage step costs a full round for all of
    them (``ceil(streams / max_batch_size)`` batches). None if no stage emits
    audio within those steps.
    """
    arrivals: list[float] = []  # when each payload reaches the stage being walked
    for index, stage in enumerate(profiles):
        num_batches = math.ceil(streams / stage.max_batch_size)
        round_s = num_batches * (
            stage.step_s + stage.per_stream_s * min(streams, stage.max_batch_size)
        )
        if index == 0:  # source mode: one unit per round, back to back, after the prefill
            prefill_s = (
                stage.prefill_s * num_batches + stage.prefill_per_word_s * num_words * streams
            )
            step_ends = [[prefill_s + round_s * (k + 1)] for k in range(steps)]
        else:
            step_ends = _greedy_steps(arrivals, stage, round_s)
        outputs: list[float] = []
        count = 0
        for group in step_ends:
            shows = False
            for end in group:
                count += 1
                outputs += [end] * stage.outputs_per_input
                shows = shows or (stage.visible_every > 0 and count % stage.visible_every == 0)
            if shows and stage.audio_s_per_visible is not None:
                return group[-1]
        arrivals = outputs
    return None


def _greedy_steps(arrivals: list[float], stage: StageProfile, step_s: float) -> list[list[float]]:
    """Step ends of an input-mode stage fed at ``arrivals`` (sorted): each step starts when
    the previous one ended and an input is there, and takes up to ``inputs_per_step`` of
    the inputs waiting then. One list per step, one entry (its end) per input taken."""
    groups: list[list[float]] = []
    free_at = 0.0
    i = 0
    while i < len(arrivals):
        start = max(free_at, arrivals[i])
        taken = [a for a in arrivals[i : i + stage.inputs_per_step] if a <= start]
        end = start + step_s
        groups.append([end] * len(taken))
        i += len(taken)
        free_at = end
    return groups


def capacity_requests_per_s(
    profiles: Sequence[StageProfile], steps: int, streams: int | None = None, num_words: int = 0
) -> float:
    """Requests per second of the slowest stage with ``streams`` in every batch (full
    batches when None): what a zero-overhead runtime serves to streams that start
    together.

    Prefill is counted: a source stage prefills each batch of new requests once
    (``prefill_s``, plus ``prefill_per_word_s`` per word of each ``num_words``-word
    prompt) on top of its ``steps`` steps. Assumes each stage passes on one payload
    per unit (``outputs_per_input`` 1), as the Qwen3-Omni-shaped configs do.
    """
    return _capacity(profiles, steps, streams, num_words, one_prefill_per_request=False)


def open_loop_capacity_requests_per_s(
    profiles: Sequence[StageProfile], steps: int, num_words: int = 0
) -> float:
    """Requests per second of the slowest stage with full batches fed by arrivals one
    at a time: every request pays a whole prefill (``prefill_s``), since a stage charges
    it on each step that holds a fresh stream and spread-out arrivals rarely share one.

    An upper bound on prefill cost (and so a lower bound on capacity): Poisson arrivals
    at rate r meet steps of length t together with probability 1 - exp(-r t) per step,
    a little under the r t this charges (22 % of steps against 25 % when r t = 1/4).
    """
    return _capacity(profiles, steps, None, num_words, one_prefill_per_request=True)


def _capacity(
    profiles: Sequence[StageProfile],
    steps: int,
    streams: int | None,
    num_words: int,
    one_prefill_per_request: bool,
) -> float:
    rates = []
    for stage in profiles:
        batch = stage.max_batch_size if streams is None else min(streams, stage.max_batch_size)
        per_request = steps if stage.steps is not None else math.ceil(steps / stage.inputs_per_step)
        busy_s = per_request * (stage.step_s + stage.per_stream_s * batch)
        if stage.steps is not None:
            prefills = batch if one_prefill_per_request else 1
            busy_s += stage.prefill_s * prefills + stage.prefill_per_word_s * num_words * batch
        rates.append(batch / busy_s if busy_s > 0 else math.inf)
    return min(rates)


def unit_interval_s(stage: StageProfile, streams: int) -> float:
    """Time between one stream's units at ``stage`` when ``streams`` keep it saturated:
    ``ceil(streams / max_batch_size)`` steps per round, ``inputs_per_step`` units per
    stream per round in input mode (one in source mode)."""
    batch = min(streams, stage.max_batch_size)
    round_s = math.ceil(streams / stage.max_batch_size) * (
        stage.step_s + stage.per_stream_s * batch
    )
    return round_s / (stage.inputs_per_step if stage.steps is None else 1)


def max_continuous_streams(profiles: Sequence[StageProfile], limit: int = 1024) -> int | None:
    """The most concurrent streams for which every stage keeps up with real-time audio.

    A stream stays continuous while its slowest stage makes units at least as fast
    as the audio they become is played (one payload per unit along the chain
    assumed). None when no stage emits audio.
    """
    audio = next((p for p in profiles if p.audio_s_per_visible is not None), None)
    if audio is None or audio.audio_s_per_visible is None:
        return None
    audio_per_unit_s = audio.audio_s_per_visible / audio.visible_every
    best = 0
    for streams in range(1, limit + 1):
        if max(unit_interval_s(p, streams) for p in profiles) > audio_per_unit_s:
            break
        best = streams
    return best
