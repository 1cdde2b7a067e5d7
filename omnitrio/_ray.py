"""Stages placed on Ray actors (``placement: ray``); imported only by pipelines that use it.

The supervisor's ``StageActor`` plans and applies exactly as for a thread; only
execute moves: ``RayPlacement.submit`` is one ``execute.remote(plan)`` and its
result comes back into trio with one ``run_sync_soon`` (from the future's
callback), as a thread's does. In the Ray actor (``_StageProcess``) the same
``StageRunner`` loads and steps the unchanged stage class.

Payloads between two Ray-placed stages stay in Ray's object store: the upstream
actor ``ray.put``s a step's payloads as one object and returns a ``_Slice`` (the
object's reference and an index) for each, the supervisor routes slices on the edge
as it routes any payload (credits count items, not bytes), and the downstream actor
fetches each object once per step. Payloads to or from a thread-placed stage
are copied through the supervisor and counted (``num_payload_bytes_relayed``).

If the actor's process dies, every round out fails with ``StageLost`` (the actor
then fails the streams the stage held) and a fresh actor loads the stage; until it
has, the stage is out of service (``restarting``, so ``/health`` says degraded).

A newcomer, or an open stream's input that came after the queued round was planned
(joining it, or topping up the step it has there), goes into that round here too
(``amend``), though the round's plan is already in the actor's process, queued behind
the running step: the supervisor asks the process to hold it (``hold``, a method of
its own concurrency group, so it is answered while a step runs); if it has not
started, the process holds it, the supervisor builds the amended plan on trio and
sends it (``release``), and the round starts with it. The round starts late only if
the running step ends meanwhile (one round trip, and only when something joins or
tops up; ``num_holds`` counts the asks). Steps, loads and closes keep the
actor's default group: one at a time, in the order they were sent. A stage that
closes while a ``hold`` is unanswered sends the ``release`` itself, so the held step
(and the close queued behind it) is never left waiting.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

import outcome
import ray
import ray.exceptions
import trio

from ._config import StageSpec
from ._placement_protocol import OnDone, StageLost
from ._runner import Plan, Result, StageRunner
from ._stage import StepLimits, StreamOutput, StreamWork

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class _Slice:
    """One payload of a step, in Ray's object store with the rest of that step's."""

    ref: ray.ObjectRef[tuple[object, ...]]
    index: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Reply:
    """What a Ray actor sends back for a ``Plan``."""

    result: Result
    num_payload_bytes_relayed: int
    model: Mapping[str, float]


class _StageProcess:
    """The executing half in a Ray actor's process: a ``StageRunner`` and the payload
    references on its edges."""

    def __init__(
        self, spec: StageSpec, source: str, feeds_edge: bool, payloads_by_reference: bool
    ) -> None:
        self._runner = StageRunner(spec, source, feeds_edge=feeds_edge)
        self._by_reference = payloads_by_reference
        self._turn = threading.Condition()  # guards the three below
        self._started = -1  # the number of the latest step to start
        self._held: set[int] = set()  # steps the supervisor is amending: not to start yet
        self._amended: dict[int, Plan] = {}  # the plans they start with instead

    def load(self) -> tuple[StepLimits, int]:
        self._runner.load()
        return self._runner.limits, os.getpid()

    @ray.method(concurrency_group="amend")
    def hold(self, number: int) -> bool:
        """Hold step ``number`` until ``release``; False if it has started."""
        with self._turn:
            if self._started >= number:
                return False
            self._held.add(number)
            return True

    @ray.method(concurrency_group="amend")
    def release(self, number: int, plan: Plan | None) -> None:
        """Let held step ``number`` start, with ``plan`` if not None."""
        with self._turn:
            self._held.discard(number)
            if plan is not None:
                self._amended[number] = plan
            self._turn.notify_all()

    def execute(self, number: int, plan: Plan) -> _Reply:
        with self._turn:
            self._turn.wait_for(lambda: number not in self._held)
            plan = self._amended.pop(number, plan)
            self._started = number
        batch, lost, num_in = _fetched(plan.batch)
        result = self._runner.execute(dataclasses.replace(plan, batch=batch))
        if lost:  # those streams fail here: the stage never saw them in this step
            result.stepped += list(lost)
            failed = {sid: StreamOutput(error=error) for sid, error in lost.items()}
            result.outputs = {**result.outputs, **failed}
        num_out = 0
        if self._by_reference:
            result.outputs = _by_reference(result.outputs)
        else:
            num_out = sum(_nbytes(p) for o in result.outputs.values() for p in o.payloads)
        return _Reply(result, num_in + num_out, self._runner.model_statistics())

    def close_all(self) -> None:
        self._runner.close_all()


class PayloadLost(RuntimeError):
    """An input payload was lost with the Ray process that made it (that stage died)."""


def _fetched(
    batch: tuple[StreamWork, ...],
) -> tuple[tuple[StreamWork, ...], dict[str, PayloadLost], int]:
    """The batch with its inputs' slices fetched (one ``ray.get`` for every object they
    are in); the streams whose inputs were lost, left out of it; and the bytes of the
    inputs that came by value through the supervisor."""
    refs = list({i.ref: None for w in batch for i in w.inputs if isinstance(i, _Slice)})
    num_bytes = sum(_nbytes(i) for w in batch for i in w.inputs if not isinstance(i, _Slice))
    if not refs:
        return batch, {}, num_bytes
    objects: dict[Any, Any] = {}
    try:
        objects.update(zip(refs, ray.get(refs), strict=True))
    except ray.exceptions.ObjectLostError:
        for ref in refs:  # which ones: the rest of the batch steps
            try:
                objects[ref] = ray.get(ref)
            except ray.exceptions.ObjectLostError as error:
                problem = f"an input was lost with the Ray process that made it ({error!r:.80})"
                objects[ref] = PayloadLost(problem)
    fetched: list[StreamWork] = []
    lost: dict[str, PayloadLost] = {}
    for work in batch:
        missing = [objects[i.ref] for i in work.inputs if isinstance(i, _Slice)]
        gone = next((m for m in missing if isinstance(m, PayloadLost)), None)
        if gone is not None:
            lost[work.stream_id] = gone
            continue
        values = tuple(objects[i.ref][i.index] if isinstance(i, _Slice) else i for i in work.inputs)
        fetched.append(dataclasses.replace(work, inputs=values))
    return tuple(fetched), lost, num_bytes


def _by_reference(outputs: Mapping[str, StreamOutput]) -> dict[str, StreamOutput]:
    """The step's payloads as one object in Ray's object store, a slice of it each."""
    payloads = tuple(p for o in outputs.values() for p in o.payloads)
    if not payloads:
        return dict(outputs)
    ref = ray.put(payloads)
    index = 0
    sliced: dict[str, StreamOutput] = {}
    for sid, output in outputs.items():
        count = len(output.payloads)
        slices = tuple(_Slice(ref, index + i) for i in range(count))
        sliced[sid] = dataclasses.replace(output, payloads=slices) if count else output
        index += count
    return sliced


def _nbytes(payload: object) -> int:
    """Serialized size of a payload (out-of-band buffers, e.g. arrays, counted, not copied)."""
    buffers: list[pickle.PickleBuffer] = []
    pickled = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    return len(pickled) + sum(b.raw().nbytes for b in buffers)


# A dead actor is not restarted by Ray: ``RayPlacement`` makes a fresh one, so that
# every round sent to the dead one fails (``StageLost``) and none runs on the new one.
# ``hold`` and ``release`` run on a thread of their own ("amend"), beside a step (Ray's
# type hints for ``ray.remote`` do not name ``concurrency_groups``).
_OPTIONS: dict[str, Any] = {"max_restarts": 0, "concurrency_groups": {"amend": 1}}
_RemoteStage: Any = ray.remote(**_OPTIONS)(_StageProcess)


class RayPlacement:
    """A stage in a Ray actor, as seen from the supervisor (see the module docstring)."""

    def __init__(
        self, spec: StageSpec, source: str, *, feeds_edge: bool, payloads_by_reference: bool
    ) -> None:
        self._spec = spec
        self._args = (spec, source, feeds_edge, payloads_by_reference)
        self._actor: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._model: Mapping[str, float] = {}
        self._num_submitted = 0  # steps sent to the current actor
        self._asking = False  # a ``hold`` is out, unanswered
        self._asked = -1  # the step that ``hold`` asked for
        self._started_up_to = -1  # steps the actor said had started when asked
        self.num_holds = 0
        """``hold`` calls sent (each a round trip to the stage's process; for measurement)."""
        self.restarting = False
        self.num_payload_bytes_relayed = 0
        self.pid: int | None = None
        """The process id of the stage's current actor (for operators and tests)."""

    async def load(self) -> StepLimits:
        self._token = trio.lowlevel.current_trio_token()
        self._actor = self._create()
        done = trio.Event()
        loaded: list[outcome.Outcome[tuple[StepLimits, int]]] = []

        def finish(value: outcome.Outcome[tuple[StepLimits, int]]) -> None:
            loaded.append(value)
            done.set()

        self._when_ready(self._actor.load.remote(), finish)
        await done.wait()
        limits, self.pid = loaded[0].unwrap()
        return limits

    def submit(self, plan: Plan, on_done: OnDone) -> None:
        actor, number = self._actor, self._num_submitted
        self._num_submitted += 1
        ref = actor.execute.remote(number, plan)
        self._when_ready(ref, partial(self._executed, actor, on_done))

    def amend(self, build: Callable[[], Plan | None]) -> bool | None:
        """Ask the actor to hold the step last sent; ``build`` runs once it does (see
        the module docstring). False if it had started when last asked; None while
        asking (one question at a time)."""
        number = self._num_submitted - 1
        if number <= self._started_up_to or self.restarting or self._actor is None:
            return False
        if not self._asking:
            self._asking, self._asked = True, number
            self.num_holds += 1
            actor = self._actor
            ref = actor.hold.remote(number)
            self._when_ready(ref, partial(self._held, actor, number, build))
        return None

    def _held(
        self,
        actor: Any,
        number: int,
        build: Callable[[], Plan | None],
        held: outcome.Outcome[bool],
    ) -> None:
        """The actor's answer to ``hold``, on the trio thread. Never raises."""
        if actor is not self._actor:
            return  # answered by an actor since replaced
        self._asking = False
        if not isinstance(held, outcome.Value):
            return  # the actor died: its rounds fail with StageLost
        if not held.unwrap():
            self._started_up_to = max(self._started_up_to, number)
            return
        plan: Plan | None = None
        try:
            plan = build()
        except Exception:  # the step must never stay held: it starts as it was
            logger.exception("stage %r: amending a held step failed", self._spec.name)
        finally:
            actor.release.remote(number, plan)

    async def close(self, deadline: float) -> bool:
        actor, self._actor = self._actor, None
        if actor is None:
            return True
        if self._asking:  # its answer will find the actor gone: let a held step start
            actor.release.remote(self._asked, None)
        done = trio.Event()
        self._when_ready(actor.close_all.remote(), lambda _: done.set())
        with trio.CancelScope(shield=True, deadline=deadline):
            await done.wait()
        # Queued behind any step still running, close_all ran or the deadline passed:
        # either way the actor goes now (a stuck step dies with its process).
        ray.kill(actor, no_restart=True)
        return done.is_set()

    def model_statistics(self) -> Mapping[str, float]:
        return self._model  # as of the latest round back

    def _create(self) -> Any:
        spec, resources = self._spec, self._spec.resources
        options: dict[str, Any] = {"name": None}
        if resources is not None:
            options.update(num_cpus=resources.num_cpus, num_gpus=resources.num_gpus)
            if resources.custom:
                options["resources"] = dict(resources.custom)
        else:
            options.update(num_cpus=0)
        logger.info("placing stage %r on a Ray actor (%s)", spec.name, options)
        self._num_submitted, self._asking, self._started_up_to = 0, False, -1
        return _RemoteStage.options(**options).remote(*self._args)

    def _executed(self, actor: Any, on_done: OnDone, value: outcome.Outcome[_Reply]) -> None:
        if isinstance(value, outcome.Error):
            if isinstance(value.error, StageLost) and actor is self._actor:
                self._restart()
            on_done(outcome.Error(value.error))
            return
        reply = value.unwrap()
        self.num_payload_bytes_relayed += reply.num_payload_bytes_relayed
        self._model = reply.model
        on_done(outcome.Value(reply.result))

    def _restart(self) -> None:
        """The actor's process died: load the stage on a fresh actor (rounds submitted
        meanwhile queue behind its load)."""
        logger.error(
            "stage %r: its Ray actor's process (pid %s) died; restarting it",
            self._spec.name,
            self.pid,
            extra={"stage": self._spec.name},
        )
        self.restarting = True
        self._actor = actor = self._create()
        self._when_ready(actor.load.remote(), partial(self._restarted, actor))

    def _restarted(self, actor: Any, value: outcome.Outcome[tuple[StepLimits, int]]) -> None:
        if actor is not self._actor:
            return
        if isinstance(value, outcome.Error):
            logger.error(
                "stage %r did not load again after its process died; it stays out of service",
                self._spec.name,
                exc_info=value.error,
                extra={"stage": self._spec.name},
            )
            return
        _, self.pid = value.unwrap()
        self.restarting = False
        logger.warning("stage %r is back (pid %s)", self._spec.name, self.pid)

    def _when_ready(self, ref: Any, callback: Callable[[outcome.Outcome[T]], None]) -> None:
        """``callback(outcome)`` on the trio thread once ``ref`` is ready: one
        ``run_sync_soon`` from the future's callback, as a worker thread's."""
        token = self._token
        assert token is not None

        def landed(future: Future[T]) -> None:
            value = outcome.capture(_result, future, self._spec.name)
            try:
                token.run_sync_soon(callback, value)
            except trio.RunFinishedError:
                logger.warning("stage %r: a Ray call ended after its trio run", self._spec.name)

        ref.future().add_done_callback(landed)


def _result(future: Future[T], stage: str) -> T:
    """The future's value; Ray's wrappers unwrapped: the stage's own error as itself,
    a dead actor as ``StageLost``."""
    try:
        return future.result()
    except ray.exceptions.RayTaskError as error:
        cause = error.cause
        raise (cause if isinstance(cause, Exception) else error) from None
    except ray.exceptions.RayActorError as error:
        raise StageLost(f"stage {stage!r}: its Ray actor died ({type(error).__name__})") from None
