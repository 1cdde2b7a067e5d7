"""Where a stage executes: the seam between an actor's deciding and executing halves.

A ``StageActor`` plans and applies on trio whatever the placement; only *execute*
moves. ``ThreadPlacement`` runs the ``StageRunner`` on a dedicated thread of this
process (the default). ``placement: ray`` runs the same runner in a Ray actor
(``_ray.py``, imported only then, so the runtime needs no Ray otherwise). Each hands
a ``Plan`` over with ``submit`` and brings the ``Result`` back with one
``run_sync_soon`` into trio, so the actor cannot tell them apart except by
``StageLost`` (the stage's process died) and ``restarting``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import trio

from ._config import StageSpec
from ._placement_protocol import OnDone, Placement
from ._placement_protocol import StageLost as StageLost  # re-exported: the actor catches it
from ._runner import Plan, StageRunner
from ._stage import StepLimits
from ._worker import WorkerThread


class ThreadPlacement:
    """The stage on a dedicated thread of this process."""

    restarting = False
    pid = None
    num_payload_bytes_relayed = 0

    def __init__(self, spec: StageSpec, source: str, *, feeds_edge: bool) -> None:
        self._runner = StageRunner(spec, source, feeds_edge=feeds_edge)
        self._worker: WorkerThread | None = None
        self._last_job = -1  # the worker's number for the plan last submitted
        self._last_plan: Plan | None = None

    async def load(self) -> StepLimits:
        self._worker = WorkerThread(f"omnitrio-stage-{self._runner.name}")
        await self._worker.run(self._runner.load)
        return self._runner.limits

    def submit(self, plan: Plan, on_done: OnDone) -> None:
        assert self._worker is not None
        self._last_job = self._worker.submit(partial(self._runner.execute, plan), on_done)
        self._last_plan = plan

    def amend(self, build: Callable[[], Plan | None]) -> bool:
        worker, last = self._worker, self._last_plan
        if worker is None or last is None:
            return False
        execute = self._runner.execute

        def make() -> Callable[[], object]:
            plan = build()
            if plan is None:
                plan = last
            self._last_plan = plan
            return partial(execute, plan)

        return worker.replace(self._last_job, make)

    async def close(self, deadline: float) -> bool:
        worker = self._worker
        if worker is None:
            return True
        # Queued behind any job still running (a load or a step cut off by
        # cancellation), the final job closes whatever the stage holds by then.
        with trio.CancelScope(shield=True, deadline=deadline):
            await worker.run(self._runner.close_all)
        return await worker.stop(deadline)

    def model_statistics(self) -> Mapping[str, float]:
        return self._runner.model_statistics()


def place(
    spec: StageSpec, source: str, *, feeds_edge: bool, payloads_by_reference: bool
) -> Placement:
    """The placement ``spec`` asks for. ``payloads_by_reference``: the next stage is on
    Ray too, so a Ray stage's payloads stay in Ray's object store."""
    if spec.placement == "ray":
        from ._ray import RayPlacement  # Ray is imported only by pipelines that use it

        return RayPlacement(
            spec, source, feeds_edge=feeds_edge, payloads_by_reference=payloads_by_reference
        )
    return ThreadPlacement(spec, source, feeds_edge=feeds_edge)
