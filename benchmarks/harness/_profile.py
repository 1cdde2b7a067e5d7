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

A step of ``b`` streams costs ``step_s + per_stream_s * ceil(b / replicas)`` of
device time plus ``host_s`` of host time per replica that steps (GIL held: zero-overhead
means no *runtime* overhead, the stages' own host work counts).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnitrio import PipelineConfig, resolve_impl

SYNTHETIC_IMPL = "stages.synthetic:SyntheticStage"


@dataclass(frozen=True)
class StageProfile:
    name: str
    step_s: float  # service time of one step, whatever the batch
    per_stream_s: float  # added per stream in the batch (per replica's share)
    prefill_s: float  # added to a stream's first step (source mode)
    prefill_per_word_s: float  # and this per word of its prompt
    steps: int | None  # units per stream at a source stage
    inputs_per_step: int
    outputs_per_input: int
    visible_every: int
    audio_s_per_visible: float | None  # None when its visible items are not audio
    max_batch_size: int
    frames_per_input: float | None = None  # units owed per input, one per step
    window: int | None = None  # inputs per unit, one unit per step
    replicas: int = 1
    host_s: float = 0.0  # GIL-held host time per step (per replica)

    def step_cost_s(self, batch: int) -> float:
        """One step of ``batch`` streams (device time, then host time)."""
        return (
            self.step_s
            + self.per_stream_s * math.ceil(batch / self.replicas)
            + self.host_s * min(batch, self.replicas)
        )

    def round_s(self, streams: int) -> float:
        """Steps for every one of ``streams`` streams once: ceil(streams / batch) of them."""
        batches = math.ceil(streams / self.max_batch_size)
        return batches * self.step_cost_s(min(streams, self.max_batch_size))

    def steps_per_input(self) -> float:
        """Steps (per stream) per unit of the stage before: ``frames_per_input`` for a
        talker, 1 / ``window`` for code2wav, 1 / ``inputs_per_step`` otherwise."""
        if self.frames_per_input is not None:
            return self.frames_per_input
        return 1 / (self.window if self.window is not None else self.inputs_per_step)

    def units_per_input(self) -> float:
        if self.frames_per_input is not None:
            return self.frames_per_input
        return 1 / self.window if self.window is not None else 1.0


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
                frames_per_input=params["frames_per_input"],
                window=params["window"],
                replicas=params["replicas"],
                host_s=params["host_ms"] / 1000,
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
        round_s = stage.round_s(streams)
        if index == 0:  # source mode: one unit per round, back to back, after the prefill
            prefill_s = (
                stage.prefill_s * math.ceil(streams / stage.max_batch_size)
                + stage.prefill_per_word_s * num_words * streams
            )
            unit_ends = [prefill_s + round_s * (k + 1) for k in range(steps)]
        else:
            unit_ends = _unit_ends(arrivals, stage, round_s)
        for count, end in enumerate(unit_ends, start=1):
            shows = stage.visible_every > 0 and count % stage.visible_every == 0
            if shows and stage.audio_s_per_visible is not None:
                return end
        arrivals = [end for end in unit_ends for _ in range(stage.outputs_per_input)]
    return None


def _unit_ends(arrivals: list[float], stage: StageProfile, step_s: float) -> list[float]:
    """When each unit of an input-mode stage fed at ``arrivals`` (sorted) is made: each
    step starts when the previous one ended and it has work, and takes up to
    ``inputs_per_step`` of the inputs waiting then (a window stage: a whole window)."""
    ends: list[float] = []
    free_at, owed, i = 0.0, 0.0, 0
    while i < len(arrivals) or owed >= 1 - 1e-9:
        if stage.window is not None:  # one unit per window, when its last input is there
            last = min(i + stage.window, len(arrivals)) - 1
            free_at = max(free_at, arrivals[last]) + step_s
            ends.append(free_at)
            i = last + 1
            continue
        if owed < 1 - 1e-9:  # nothing to make: wait for the next input
            free_at = max(free_at, arrivals[i])
        taken = [a for a in arrivals[i : i + stage.inputs_per_step] if a <= free_at]
        i += len(taken)
        free_at += step_s
        if stage.frames_per_input is None:
            ends += [free_at] * len(taken)
        else:
            owed += stage.frames_per_input * len(taken) - 1
            ends.append(free_at)
    return ends


def _steps_per_request(profiles: Sequence[StageProfile], steps: int) -> list[int]:
    """Steps each stage makes for one request of ``steps`` source units."""
    counts, units = [], float(steps)
    for stage in profiles:
        if stage.steps is not None:
            counts.append(steps)
        else:
            counts.append(math.ceil(units * stage.steps_per_input() - 1e-9))
            units *= stage.units_per_input()
    return counts


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
    for stage, per_request in zip(profiles, _steps_per_request(profiles, steps), strict=True):
        batch = stage.max_batch_size if streams is None else min(streams, stage.max_batch_size)
        busy_s = per_request * stage.step_cost_s(batch)
        if stage.steps is not None:
            prefills = batch if one_prefill_per_request else 1
            busy_s += stage.prefill_s * prefills + stage.prefill_per_word_s * num_words * batch
        rates.append(batch / busy_s if busy_s > 0 else math.inf)
    return min(rates)


def source_unit_interval_s(profiles: Sequence[StageProfile], index: int, streams: int) -> float:
    """Time stage ``index`` takes per source unit (text token) of one stream when
    ``streams`` streams keep it saturated: its round times its steps per source unit."""
    steps, units = 1.0, 1.0  # the stage's steps, and the units reaching it, per source unit
    for stage in profiles[1 : index + 1]:
        steps = units * stage.steps_per_input()
        units *= stage.units_per_input()
    return profiles[index].round_s(streams) * steps


def max_continuous_streams(profiles: Sequence[StageProfile], limit: int = 1024) -> int | None:
    """The most concurrent streams for which every stage keeps up with real-time audio.

    A stream stays continuous while every stage makes its share of one source unit
    (a text token) at least as fast as the audio that unit becomes is played. None
    when no stage emits audio.
    """
    units = 1.0
    audio_per_source_unit_s = None
    for stage in profiles:
        if stage.steps is None:
            units *= stage.units_per_input()
        if stage.audio_s_per_visible is not None:
            audio_per_source_unit_s = units * stage.audio_s_per_visible / stage.visible_every
            break
    if audio_per_source_unit_s is None:
        return None
    best = 0
    for streams in range(1, limit + 1):
        if any(
            source_unit_interval_s(profiles, i, streams) > audio_per_source_unit_s
            for i in range(len(profiles))
        ):
            break
        best = streams
    return best
