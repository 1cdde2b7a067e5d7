"""Starting a pipeline's parts, and what holds while pipelines run: the actors built
from the config and started in pipeline order (each stage's limits checked once it has
loaded), Ray around them where a stage is placed on it, and the process-wide policies
(``gc.freeze``, the GIL's switch interval, the trio stall meter). ``open_pipeline``
(``_pipeline.py``) puts them together."""

from __future__ import annotations

import gc
import itertools
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from ._actor import StageActor
from ._config import PipelineConfig, check_stage_limits, uses_ray


class _StallMeter(trio.abc.Instrument):
    """The longest single task step on the trio thread (GC pauses included): while one
    runs, no other task, actor or client, moves."""

    def __init__(self) -> None:
        self.max_stall_s = 0.0
        self._started: float | None = None
        self.users = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._started is None:
            return  # the step that installed the meter
        stall_s = time.perf_counter() - self._started
        if stall_s > self.max_stall_s:
            self.max_stall_s = stall_s


_stall_meter = _StallMeter()

SWITCH_INTERVAL_S = 0.5e-3
"""``sys.setswitchinterval`` while pipelines run (CPython's default is 5 ms): how long
a thread holding the GIL keeps one that waits for it out. Every hand-off between
stages goes through the trio thread; with a stage that computes in Python holding
the GIL, trio would wait up to the whole default interval for each (``omnitrio bench
--cpu-bound``: 0.9x the orchestrator shape's requests/s at 5 ms, 1.2-1.5x at 0.5 ms,
``docs/benchmarks.md``)."""

_saved_switch_interval_s: float | None = None


def max_trio_stall_s() -> float:
    """The longest single step on the trio thread since the policies went on."""
    return _stall_meter.max_stall_s


@asynccontextmanager
async def runtime_policies() -> AsyncIterator[None]:
    """While any pipeline runs, three process-wide policies, undone when the last one
    closes: what start-up allocated (modules, models, configs) frozen out of the
    collector's way (``gc.freeze``), so a gen-2 collection no longer walks it on the
    trio thread; the stall meter on (from after that collection); and the GIL's
    switch interval at ``SWITCH_INTERVAL_S``."""
    global _saved_switch_interval_s
    if _stall_meter.users == 0:
        gc.collect()
        gc.freeze()
        _saved_switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        _stall_meter.max_stall_s = 0.0
        _stall_meter._started = None
        trio.lowlevel.add_instrument(_stall_meter)
    _stall_meter.users += 1
    try:
        yield
    finally:
        _stall_meter.users -= 1
        if _stall_meter.users == 0:
            gc.unfreeze()
            if _saved_switch_interval_s is not None:
                sys.setswitchinterval(_saved_switch_interval_s)
                _saved_switch_interval_s = None
            trio.lowlevel.remove_instrument(_stall_meter)


def build_actors(config: PipelineConfig) -> tuple[list[StageActor], StageActor | None]:
    """The chain's actors (each linked to the next) and the side stage's, not yet started."""
    source, specs = config.source, config.stages
    actors = [
        StageActor(
            spec,
            source,
            scheduling=config.pipeline.scheduling,
            feeds_edge=config.edge_from(spec.name) is not None,
            payloads_by_reference=spec.placement == "ray"
            and index + 1 < len(specs)
            and specs[index + 1].placement == "ray",
        )
        for index, spec in enumerate(specs)
    ]
    for upstream, downstream in itertools.pairwise(actors):
        upstream.downstream = downstream
    side_spec = config.side_stage
    side = None if side_spec is None else StageActor(side_spec, source, feeds_edge=False)
    return actors, side


async def start_actors(
    nursery: trio.Nursery, config: PipelineConfig, actors: list[StageActor], side: StageActor | None
) -> None:
    """Start the actors in pipeline order, then the side stage, each in ``nursery`` once
    the one before has loaded; a stage that fails to load raises (``StageLoadError``)."""
    timeout_s = config.pipeline.shutdown_timeout_s
    for actor in [*actors, *([side] if side else [])]:
        check = _checker(config, actor.name, on_chain=actor is not side)
        await _start(nursery, actor, check, timeout_s)


async def _start(
    nursery: trio.Nursery,
    actor: StageActor,
    check: Callable[[int, int], None],
    shutdown_timeout_s: float,
) -> None:
    async def run(*, task_status: trio.TaskStatus[None]) -> None:
        try:
            limits = await actor.load()
            check(limits.max_payloads_per_step, limits.max_visible_per_step)
            task_status.started()
            await actor.serve()
        finally:
            await actor.shutdown(shutdown_timeout_s)

    await nursery.start(run)


@asynccontextmanager
async def ray_if_placed(config: PipelineConfig) -> AsyncIterator[None]:
    """Ray around the pipeline if a stage has ``placement: ray`` (only then is it imported)."""
    if not uses_ray(config):
        yield
        return
    from ._ray_cluster import open_ray

    async with open_ray(config):
        yield


def _checker(config: PipelineConfig, stage: str, *, on_chain: bool) -> Callable[[int, int], None]:
    def check(max_payloads_per_step: int, max_visible_per_step: int) -> None:
        payloads = max_payloads_per_step if on_chain else 0
        check_stage_limits(config, stage, payloads, max_visible_per_step)

    return check
