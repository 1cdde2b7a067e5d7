"""Stages placed on Ray actors (``placement: ray``), on the session's two-node cluster.

The runtime's invariant tests also run with Ray placement (their ``placement``
fixture); these are the Ray-only ones: payloads by reference, a killed stage
process, a clean stop, and a stage pinned to the second node.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import outcome
import pytest
import trio

import omnitrio
from omnitrio import Event
from omnitrio._runner import Plan
from omnitrio._slot import Slot
from omnitrio._stage import StreamWork
from tests.conftest import (
    Announced,
    chain_config,
    collect,
    prompt_until_signal,
    texts,
    wait_until_exited,
)

if TYPE_CHECKING:
    from omnitrio._actor import StageActor
    from omnitrio._ray import RayPlacement

pytestmark = pytest.mark.usefixtures("ray_cluster")

MB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]
CLI = (sys.executable, "-m", "omnitrio._cli")


def _ignore(value: object) -> None:
    """A round's result nobody waits for."""


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _peak_growth_bytes(placements: tuple[str, str]) -> tuple[int, int]:
    """Stream 24 payloads of 8 MB from a to b; (the supervisor's peak memory growth
    meanwhile, the payload bytes it relayed)."""
    config = chain_config(
        [{"steps": 24, "payload_bytes": 8 * MB}, {"outputs_per_input": 0}], edge_capacity=2
    )
    stages = [
        s.model_copy(update={"placement": p})
        for s, p in zip(config.stages, placements, strict=True)
    ]
    config = config.model_copy(update={"stages": tuple(stages)})
    peak = 0
    async with omnitrio.open_pipeline(config) as pipeline:
        baseline = _rss_bytes()

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, _rss_bytes())
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            async with pipeline.open_stream("big") as stream:
                items = await collect(stream)
            nursery.cancel_scope.cancel()
        stats = pipeline.statistics()
    assert [t for t in texts(items) if t.startswith("b:")] == [f"b:{i} " for i in range(1, 25)]
    assert stats.num_payloads_routed == 24
    return peak - baseline, stats.num_payload_bytes_relayed


async def test_payloads_between_ray_stages_stay_out_of_the_supervisor() -> None:
    growth, relayed = await _peak_growth_bytes(("ray", "ray"))
    assert relayed == 0
    assert growth < 8 * MB, growth / MB  # it never held one of them
    # Against a thread consumer, the same payloads come through the supervisor.
    growth, relayed = await _peak_growth_bytes(("ray", "thread"))
    assert relayed > 24 * 8 * MB
    assert growth > 8 * MB


async def test_payloads_between_a_thread_and_a_ray_stage_are_counted() -> None:
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "mixed"},
            "stages": [
                {
                    "name": "a",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"steps": 3, "payload_bytes": 1000},
                },
                {
                    "name": "b",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"outputs_per_input": 0},
                    "placement": "ray",
                },
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("x") as stream:
            await collect(stream)
        stats = pipeline.statistics()
    assert stats.stages["a"].num_payload_bytes_relayed == 0  # a thread: nothing copied
    assert stats.stages["b"].pid is not None
    assert stats.stages["a"].pid is None
    assert 3 * 1000 < stats.stages["b"].num_payload_bytes_relayed < 3 * 2000


async def test_killing_a_stage_process_fails_the_streams_it_held_and_it_comes_back() -> None:
    # b takes 0.5 s to load: long enough to see it out of service while it loads again.
    config = chain_config(
        [{"steps": 100_000}, {"load_time_ms": 500}, {"outputs_per_input": 0}], placement="ray"
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        pid = pipeline.statistics().stages["b"].pid
        assert pid is not None
        failures: list[BaseException] = []
        hung_when_failed: list[bool] = []  # /health: degraded

        async def doomed(label: str, started: trio.Event) -> None:
            async with pipeline.open_stream(label) as stream:
                try:
                    async for item in stream:
                        if isinstance(item, omnitrio.TextDelta) and item.text.startswith("b:"):
                            started.set()  # b holds it
                except omnitrio.StageError as exc:
                    failures.append(exc)
                    hung_when_failed.append(pipeline.statistics().stages["b"].hung)

        with trio.fail_after(60), Announced("b", "is back") as back:
            async with trio.open_nursery() as nursery:
                for label in ("one", "two"):
                    started = trio.Event()
                    nursery.start_soon(doomed, label, started)
                    await started.wait()
                os.kill(pid, signal.SIGKILL)
            await back.wait()  # the fresh actor has loaded the stage
        assert len(failures) == 2
        for error in failures:
            assert isinstance(error, omnitrio.StageError)
            assert error.stage == "b"
            assert "died" in str(error)
        assert hung_when_failed == [True, True]
        # Out of service until the fresh actor has loaded the stage, then it serves.
        assert not pipeline.statistics().stages["b"].hung
        with trio.fail_after(60):
            request = omnitrio.Request("after", options={"steps": 3})
            async with pipeline.open_stream(request) as stream:
                items = await collect(stream)
        stats = pipeline.statistics().stages["b"]
    assert [t for t in texts(items) if t.startswith("b:")] == ["b:1 ", "b:2 ", "b:3 "]
    assert stats.pid not in (None, pid)


def _state(pid: int) -> str:
    """Process ``pid``'s state letter (``/proc/<pid>/stat``), or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


EXITED = {"gone", "Z", "X"}
"""A process that has exited: reaped, a zombie, or dead while its parent reaps it (X:
beside a busy CPU the parent can be caught in the middle of that)."""


async def test_leaving_removes_every_ray_actor_within_the_shutdown_timeout() -> None:
    config = chain_config(
        [{"steps": 100_000}, {"service_time_ms": 1}, {"outputs_per_input": 0}],
        placement="ray",
        shutdown_timeout_s=2.0,
    )
    async with omnitrio.open_pipeline(config) as pipeline:
        pids = [s.pid for s in pipeline.statistics().stages.values()]
        async with pipeline.open_stream("left running") as stream:
            await stream.receive()
        started = trio.current_time()
    assert trio.current_time() - started < 2.0
    assert all(pid is not None for pid in pids)
    with trio.fail_after(60):  # a hang guard: killed processes exit on their own (beside
        # a busy CPU, one took over 10 s)
        for pid in pids:
            assert pid is not None
            await wait_until_exited(pid)
    states = {pid: _state(pid) for pid in pids if pid is not None}
    assert set(states.values()) <= EXITED, states


async def test_a_stage_closing_while_its_queued_step_is_held_lets_it_start() -> None:
    """The answer to ``hold`` comes after the stage began to close (so nobody builds an
    amended plan): the held step still starts, with its own plan, and the stage closes
    behind it at once instead of at the shutdown deadline."""
    from omnitrio._ray import RayPlacement  # Ray is imported only with its cluster

    spec = chain_config([{"steps": 4, "service_time_ms": 300}], placement="ray").stages[0]
    placement = RayPlacement(spec, "test", feeds_edge=False, payloads_by_reference=False)
    await placement.load()
    request = omnitrio.Request("held")
    placement.submit(Plan((), (("s", request),), (StreamWork("s", (), True),)), _ignore)
    placement.submit(Plan((), (), (StreamWork("s", (), True),)), _ignore)
    built: list[object] = []
    assert placement.amend(lambda: built.append(1)) is None  # asked; answered later
    started = trio.current_time()
    closed = await placement.close(started + 10.0)
    assert closed  # close_all ran: the held step was let go
    assert trio.current_time() - started < 5.0
    assert not built  # the actor was gone when the answer came


async def test_a_stage_pinned_by_a_custom_resource_runs_on_the_second_node(
    ray_cluster: Any,
) -> None:
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "two-nodes"},
            "stages": [
                {
                    "name": "a",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"steps": 5},
                    "placement": "ray",
                    "resources": {"custom": {"node_a": 1}},
                },
                {
                    "name": "b",
                    "impl": "stages.synthetic:SyntheticStage",
                    "placement": "ray",
                    "params": {"outputs_per_input": 0},
                    "resources": {"custom": {"node_b": 1}},
                },
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
    )
    head, second = ray_cluster.list_all_nodes()
    raylets = {node: node.all_processes["raylet"][0].process.pid for node in (head, second)}
    async with omnitrio.open_pipeline(config) as pipeline:
        async with pipeline.open_stream("x") as stream:
            items = await collect(stream)
        stages = pipeline.statistics().stages
        # A worker is a child of its node's raylet. Asked while the pipeline holds its
        # actors: once it leaves, their processes exit (beside a busy CPU, one had
        # exited before the check read its /proc entry).
        parents = {name: _parent(stages[name].pid) for name in ("a", "b")}
    assert [t for t in texts(items) if t.startswith("b:")] == [f"b:{i} " for i in range(1, 6)]
    assert parents == {"a": raylets[head], "b": raylets[second]}


def _parent(pid: int | None) -> int:
    assert pid is not None
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _exited_by(pid: int, deadline: float) -> bool:
    """Whether process ``pid`` exits before ``time.monotonic()`` reaches ``deadline``:
    waits on its pidfd, which becomes readable when it exits (Linux 5.3+)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(pidfd)
    return bool(readable)


def test_sigterm_stops_the_pipeline_and_the_ray_instance_it_started(tmp_path: Path) -> None:
    config = tmp_path / "long.yaml"
    config.write_text(
        (REPO / "configs" / "synthetic-ray.yaml").read_text().replace("steps: 24", "steps: 100000")
    )
    # Its own Ray instance (not the session's cluster), found by its temp folder: every
    # Ray process of the instance names it on its command line.
    ray_temp = Path(tempfile.mkdtemp(prefix="omnitrio-ray-", dir="/tmp"))
    env = {"RAY_TMPDIR": str(ray_temp)}

    def running() -> None:
        assert _processes_mentioning(str(ray_temp))  # the instance runs

    stopped = prompt_until_signal(config, signal.SIGTERM, env=env, when_ready=running)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "SIGTERM; pipeline stopped" in stopped.stderr
    assert "*** SIGTERM received" not in stopped.stderr  # not Ray's crash handler: Python's
    assert stopped.exit_s < 5.0 + 10.0  # shutdown_timeout_s, plus Ray's own stop
    # The instance's processes exit on their own: wait for each to (its pidfd says so).
    deadline = time.monotonic() + 10
    for pid in _processes_mentioning(str(ray_temp)):
        assert _exited_by(pid, deadline), f"process {pid} of the Ray instance is still running"
    assert _processes_mentioning(str(ray_temp)) == []
    shutil.rmtree(ray_temp, ignore_errors=True)


# Run in a child process of its own (a local Ray instance, not the session's cluster):
# trio's cached worker threads end after IDLE_TIMEOUT without work, cut to 50 ms here.
# The local instance's processes die with the thread that started them
# (PR_SET_PDEATHSIG), so this once killed the instance under its pipeline.
_OUTLIVES_IDLE_THREADS = """
import sys, threading, trio, trio._core._thread_cache as thread_cache
import omnitrio
thread_cache.IDLE_TIMEOUT = 0.05

def trio_threads():
    return [t for t in threading.enumerate() if t.name.startswith("Trio thread")]

async def main():
    async with omnitrio.open_pipeline(omnitrio.load_config(sys.argv[1])) as pipeline:
        while trio_threads():  # every cached thread, ray.init's included, has ended
            await trio.sleep(0.05)
        with trio.fail_after(60):
            async with pipeline.open_stream(omnitrio.Request("still there?")) as stream:
                items = [item async for item in stream]
        print("answered", len(items))

trio.run(main)
"""


def test_a_local_ray_instance_outlives_the_thread_that_started_it(tmp_path: Path) -> None:
    ray_temp = Path(tempfile.mkdtemp(prefix="omnitrio-ray-", dir="/tmp"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _OUTLIVES_IDLE_THREADS, "configs/synthetic-ray.yaml"],
            cwd=REPO,
            env={**os.environ, "RAY_TMPDIR": str(ray_temp)},
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert "answered" in done.stdout


def test_a_ray_address_that_does_not_answer_is_a_config_error_at_once() -> None:
    config = REPO / "configs" / "synthetic-ray.yaml"
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, "prompt", "--config", str(config), "--ray-address", "127.0.0.1:1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"omnitrio: {config}: pipeline.ray_address: no Ray cluster answers at 127.0.0.1:1"
        in done.stderr
    )
    assert "start one (ray start --head) or fix the address" in done.stderr
    assert time.monotonic() - started < 30


async def _ray_stage(
    params: dict[str, Any], max_batch_size: int
) -> tuple[StageActor, RayPlacement, list[tuple[Any, ...]]]:
    """A loaded stage actor ``mid`` on a real Ray actor, fed by an upstream edge, whose
    answers to ``hold`` are kept back (in the list returned) for the test to pass on
    with ``RayPlacement._held``."""
    from omnitrio._actor import StageActor
    from omnitrio._ray import RayPlacement  # Ray is imported only with its cluster
    from tests.conftest import SYNTHETIC

    spec = omnitrio.StageSpec(
        name="mid", impl=SYNTHETIC, max_batch_size=max_batch_size, params=params, placement="ray"
    )
    actor = StageActor(spec, "up", feeds_edge=False)
    placement = actor._placement
    assert isinstance(placement, RayPlacement)
    answers: list[tuple[Any, ...]] = []
    placement._held = lambda *answer: answers.append(answer)  # type: ignore[method-assign]
    await actor.load()
    return actor, placement, answers


def _idle(actor: StageActor) -> Callable[[], bool]:
    return lambda: not actor._rounds and not any(map(actor._has_work, actor.slots.values()))


def _giver(actor: StageActor, given: dict[str, int]) -> Callable[..., None]:
    """Upstream's hand: each slot given gets its next input (counted in ``given``),
    then one offer."""
    from stages.synthetic import SyntheticPayload

    def give(*slots: Slot) -> None:
        for slot in slots:
            index = given[slot.id] = given.get(slot.id, -1) + 1
            assert slot.in_link is not None
            slot.in_link.reserve(1)
            slot.in_link.put([SyntheticPayload(slot.id, "up", index, float(index), b"")])
            slot.in_link.settle(1, None)
        actor.offer()

    return give


async def test_a_late_answer_to_hold_keeps_every_streams_inputs_in_order() -> None:
    """The answer to ``hold`` comes after the running step came back and the next round
    was planned (a loaded machine, a slow reply): that round opens the newcomer ``x``
    and steps ``busy`` too. ``x``'s next input, come meanwhile, must not join the held
    round (there, before ``x`` is open, the stage would drop it), nor may ``busy`` give
    its place in the held round to a later newcomer ``z`` (its input would then go
    after the later round's). Every stream's inputs are stepped, each one, in order."""
    from omnitrio._ray import RayPlacement  # Ray is imported only with its cluster
    from tests.runtime.test_actor_plan import _add, _until

    # Steps of 1 s: the ask to hold reaches the stage's process while one runs, even on
    # a loaded machine (the answer itself is kept back, so this costs no wall time).
    params = {"service_time_ms": 1000, "inputs_per_step": 1, "outputs_per_input": 0}
    actor, placement, answers = await _ray_stage({**params, "visible": "trace"}, 2)
    now_s = time.perf_counter()
    given: dict[str, int] = {}
    give = _giver(actor, given)
    idle = _idle(actor)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.serve)
            await _until(lambda: actor._serving)
            busy = _add(actor, "busy", now_s + 90.0)  # the least urgent
            w = _add(actor, "w", now_s + 50.0)
            give(busy, w)
            await _until(idle)
            give(busy, w)  # the running round (1 s)
            give(busy, w)  # the round queued behind it, held once its answer is in
            held = actor._rounds[-1]
            x = _add(actor, "x", now_s + 70.0)
            give(x)  # a newcomer: the actor asks to hold the queued round
            give(busy)
            await _until(lambda: bool(answers))  # kept back until the next round is out
            answer = answers[0][-1]
            assert isinstance(answer, outcome.Value)
            assert answer.value is True, (
                "hold reached the stage's process after the running step had ended "
                "(a loaded machine): the queued round was not held, nothing to test"
            )
            await _until(lambda: actor._rounds[0] is held and len(actor._rounds) == 2)
            later = actor._rounds[-1]
            assert {slot.id for slot in later.batch} == {"x", "busy"}
            give(x)
            z = _add(actor, "z", now_s + 10.0)
            give(z)
            RayPlacement._held(placement, *answers.pop())
            assert {slot.id for slot in held.batch} == {"busy", "z"}  # w gave z its place
            await _until(idle)
            nursery.cancel_scope.cancel()
    finally:
        await actor.shutdown(5.0)
    causes: dict[str, list[object]] = {}
    for slot in (busy, w, x, z):
        items, _ = slot.stream.client.take(None)
        causes[slot.id] = [i.data["upstream_produced_s"] for i in items if isinstance(i, Event)]
    assert causes == {sid: [float(n) for n in range(last + 1)] for sid, last in given.items()}


async def test_more_input_for_a_stream_in_the_held_round_tops_up_its_step_in_order() -> None:
    """On Ray a stream the queued round steps takes the input that came since into that
    step too, through ``hold``: ``t``'s next input, come while the running step runs.
    Then the answer to a second ``hold`` comes late, after the running step came back
    and the next round was planned to step ``s``: ``s``'s input come meanwhile must not
    top up its step in the held round (it would be stepped before the later round's),
    while ``t``'s, which no later round steps, still does. Every stream's inputs are
    stepped, each one, in order."""
    from omnitrio._ray import RayPlacement  # Ray is imported only with its cluster
    from tests.runtime.test_actor_plan import _add, _record_steps, _until

    # Steps of 1 s: both asks to hold reach the stage's process while one runs, even on
    # a loaded machine (the second answer is kept back, so this costs no wall time).
    params = {"service_time_ms": 1000, "inputs_per_step": 3, "outputs_per_input": 0}
    actor, placement, answers = await _ray_stage({**params, "visible_every": 0}, 2)
    taken = _record_steps(actor)
    now_s = time.perf_counter()
    given: dict[str, int] = {}
    give = _giver(actor, given)
    idle = _idle(actor)

    async def held_answer() -> tuple[Any, ...]:
        await _until(lambda: bool(answers))
        answer = answers.pop()
        assert not answers
        assert isinstance(answer[-1], outcome.Value)
        assert answer[-1].value is True, (
            "hold reached the stage's process after the running step had ended "
            "(a loaded machine): the queued round was not held, nothing to test"
        )
        return answer

    def inputs(round_: Any) -> dict[str, list[int]]:
        return {w.stream_id: [p.unit for p in w.inputs] for w in round_.plan.batch}

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.serve)
            await _until(lambda: actor._serving)
            s = _add(actor, "s", now_s + 50.0)
            t = _add(actor, "t", now_s + 60.0)
            give(s, t)
            await _until(idle)
            give(s, t)  # the running round (1 s)
            give(s, t)  # the round queued behind it
            held = actor._rounds[-1]
            assert inputs(held) == {"s": [2], "t": [2]}
            give(t)  # t's next input: the actor asks to hold the queued round
            RayPlacement._held(placement, *await held_answer())
            assert inputs(held) == {"s": [2], "t": [2, 3]}
            assert placement.num_holds == 1

            give(s)  # s's next input: asked again, the answer kept back
            late = await held_answer()
            await _until(lambda: actor._rounds[0] is held and len(actor._rounds) == 2)
            assert inputs(actor._rounds[-1]) == {"s": [3]}  # the later round took it
            give(s, t)
            del placement._held  # the answers to the later round's asks go through
            RayPlacement._held(placement, *late)
            assert inputs(held) == {"s": [2], "t": [2, 3, 4]}
            await _until(idle)
            nursery.cancel_scope.cancel()
    finally:
        await actor.shutdown(5.0)
    units = {sid: [p.unit for p in items] for sid, items in taken.items()}  # type: ignore[attr-defined]
    assert units == {sid: list(range(last + 1)) for sid, last in given.items()}
