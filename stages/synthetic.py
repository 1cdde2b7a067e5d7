"""Deterministic synthetic stages for tests, examples and benchmarks.

A ``SyntheticStage`` behaves like a model stage with a fixed cost per step:

- *source mode* (``steps`` set, for a first stage): each step generates one unit
  per stream, ``steps`` units in all (request option ``steps`` overrides);
- *input mode* (``steps`` unset): each step takes up to ``inputs_per_step``
  payloads from the incoming edge, one unit each.

For every unit it emits ``outputs_per_input`` payloads to the next stage
(non-visible, ``payload_bytes`` of data each, like hidden states) and, every
``visible_every`` units, one user-visible item (``visible``: text, audio or a
trace event with timings; request option ``<stage>.visible`` sets one stream's, such
as text for a stream that plays no audio). The service time is ``service_time_ms`` per step
plus ``per_stream_ms`` per stream in the batch, slept (GIL released, like a GPU
kernel) or busy-waited (``cpu_bound``, GIL held). A step costs what its profile
says: its outputs are built within that time and it returns at its deadline (a
sleep ending ``SLEEP_MARGIN_S`` early, then GIL-releasing polls of the clock,
since ``time.sleep`` alone wakes late); ``late_total_s`` and ``late_max_s`` say how far
a loaded machine still made steps overrun. In source mode a step that holds
streams' first units also costs ``prefill_ms`` once plus ``prefill_ms_per_word``
per word of their requests' text, like a batched prefill; the response option ``max_tokens``
(as the server passes it) caps the number of units.

Shapes of Qwen3-Omni's stages (input mode):

- ``frames_per_input`` (a talker): each input owes that many units (fractions
  carry over: 3.5 makes 3, then 4), made one per step, like codec frames decoded
  one per talker step for each text token;
- ``window`` (code2wav): inputs are held until a whole window of that many is
  there (or the input closes), then one step makes one unit of them; a step
  charges only for the streams that made a window, nothing when none did;
- ``replicas``: the batch is split across that many devices stepping in
  parallel (``per_stream_ms`` for the largest share), driven by one host thread.

``host_ms`` is host work per step (sampling, building each stream's output):
Python that holds the GIL, as a real stage's does, for that much of the calling
thread's CPU time, after the device time (once per replica that stepped). Where the stage runs
decides who waits for it: omnitrio's stage threads share one process's GIL.

``load_time_ms`` makes construction slow, like loading weights.

Faults on purpose: ``fail_after_units`` (per stream; request option
``<stage>.fail_after_units`` targets one stream), ``fail_step_at`` (the whole
Nth step raises), request option ``<stage>.fail_open`` (``open_stream`` raises),
and ``gate``: a named ``Gate`` every step waits on while it is closed.

``ends_without_input`` (input mode) says what input mode does anyway, that a stream
whose input ends empty has no output here: the runtime then ends it without a step.
"""

from __future__ import annotations

import math
import select
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy

from omnitrio import (
    AudioChunk,
    Event,
    Request,
    StepCost,
    StepLimits,
    StreamOutput,
    StreamWork,
    TextDelta,
    VisibleItem,
)

SLEEP_MARGIN_S = 0.2e-3
"""How long before a step's deadline its sleep ends; the rest is polled (GIL released)."""


class SyntheticFailure(RuntimeError):
    """The failure a synthetic stage injects on purpose."""


class Gate:
    """A switch a synthetic stage's steps wait on while it is closed. Thread-safe."""

    _registry: ClassVar[dict[str, Gate]] = {}
    _registry_lock = threading.Lock()

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self._changed = threading.Condition()
        self._num_blocked = 0

    @classmethod
    def named(cls, name: str) -> Gate:
        """The gate called ``name`` (made open on first use)."""
        with cls._registry_lock:
            return cls._registry.setdefault(name, cls())

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    @property
    def num_blocked(self) -> int:
        """Steps waiting at the gate right now."""
        with self._changed:
            return self._num_blocked

    def wait_until_blocked(self, timeout_s: float) -> bool:
        """Block the calling thread until a step waits at the gate (False on timeout)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._num_blocked > 0, timeout_s)

    def pass_through(self) -> None:
        if self._open.is_set():
            return
        with self._changed:
            self._num_blocked += 1
            self._changed.notify_all()
        self._open.wait()
        with self._changed:
            self._num_blocked -= 1


@dataclass(frozen=True, slots=True)
class SyntheticPayload:
    """What travels on an edge between synthetic stages (never shown to clients)."""

    stream_id: str
    stage: str
    unit: int
    produced_s: float
    data: bytes


@dataclass
class _Stream:
    request: Request
    steps_left: int | None
    fail_after_units: int | None
    units: int = 0
    owed: float = 0.0  # frames_per_input: units owed by the inputs taken so far
    held: list[object] = field(default_factory=list)  # window: inputs not yet made into a unit
    cause: object = None  # the input the next unit comes from
    visible: str = "text"  # its visible items' kind


_live: weakref.WeakSet[SyntheticStage] = weakref.WeakSet()


def live_streams() -> set[tuple[str, str]]:
    """(stage, stream id) for every stream a live synthetic stage holds state for."""
    return {(stage.name, sid) for stage in list(_live) for sid in stage.open_stream_ids}


def hold_gil_for(cpu_s: float) -> None:
    """Run Python (GIL held, as interpreted host code holds it) until this thread has
    had ``cpu_s`` of CPU: a fixed amount of work, which takes longer in wall time while
    other threads hold the GIL or the machine is busy."""
    deadline_s = time.thread_time() + cpu_s
    while time.thread_time() < deadline_s:
        pass


def _step_limits(
    steps: int | None, inputs_per_step: int, outputs_per_input: int, visible_every: int
) -> StepLimits:
    return StepLimits(
        max_payloads_per_step=max(1, (1 if steps else inputs_per_step) * outputs_per_input),
        max_visible_per_step=1 if visible_every else 0,
    )


class SyntheticStage:
    """A configurable fake model stage; see the module docstring."""

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        steps: int | None = None,
        inputs_per_step: int = 1,
        outputs_per_input: int = 1,
        payload_bytes: int = 0,
        visible_every: int = 1,
        visible: Literal["text", "audio", "trace"] = "text",
        audio_samples: int = 320,
        sample_rate_hz: int = 16000,
        service_time_ms: float = 0.0,
        per_stream_ms: float = 0.0,
        cpu_bound: bool = False,
        prefill_ms: float = 0.0,
        prefill_ms_per_word: float = 0.0,
        frames_per_input: float | None = None,
        window: int | None = None,
        replicas: int = 1,
        host_ms: float = 0.0,
        fail_after_units: int | None = None,
        fail_step_at: int | None = None,
        gate: str | None = None,
        load_time_ms: float = 0.0,
        slowdown: float = 1.0,
        slowdown_after_s: float = 0.0,
        slowdown_for_s: float = 0.0,
        ends_without_input: bool = False,
    ) -> None:
        for label, value in (
            ("inputs_per_step", inputs_per_step),
            ("audio_samples", audio_samples),
            ("replicas", replicas),
            ("window", 1 if window is None else window),
        ):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if frames_per_input is not None and frames_per_input <= 0:
            raise ValueError(f"frames_per_input must be above 0, got {frames_per_input}")
        if host_ms < 0:
            raise ValueError(f"host_ms must be at least 0, got {host_ms}")
        if steps is not None and (frames_per_input is not None or window is not None):
            raise ValueError("frames_per_input and window are for input mode (steps unset)")
        if steps is not None and ends_without_input:
            raise ValueError("ends_without_input is for input mode (steps unset)")
        if frames_per_input is not None and window is not None:
            raise ValueError("give frames_per_input (a talker) or window (code2wav), not both")
        if visible not in ("text", "audio", "trace"):
            raise ValueError(f"visible must be text, audio or trace, got {visible!r}")
        self.name = name
        self.device = device
        self.steps = steps
        self.outputs_per_input = outputs_per_input
        self.payload_bytes = payload_bytes
        self.visible_every = visible_every
        self.visible = visible
        self.audio_samples = audio_samples
        self.sample_rate_hz = sample_rate_hz
        self.service_time_s = service_time_ms / 1000
        self.per_stream_s = per_stream_ms / 1000
        self.cpu_bound = cpu_bound
        self.prefill_s = prefill_ms / 1000
        self.prefill_per_word_s = prefill_ms_per_word / 1000
        self.frames_per_input = frames_per_input
        self.window = window
        self.replicas = replicas
        self.host_s = host_ms / 1000
        self.fail_after_units = fail_after_units
        self.fail_step_at = fail_step_at
        self.gate = Gate.named(gate) if gate else None
        self.ends_without_input = ends_without_input
        # A slowdown fault: steps cost ``slowdown`` x their profile for ``slowdown_for_s``,
        # from ``slowdown_after_s`` after the first step (a noisy neighbour).
        self.slowdown = slowdown
        self.slowdown_after_s = slowdown_after_s
        self.slowdown_for_s = slowdown_for_s
        self._first_step_s: float | None = None
        time.sleep(load_time_ms / 1000)  # stands for loading weights
        self.max_inputs_per_step: int | None = inputs_per_step
        limits = _step_limits(steps, inputs_per_step, outputs_per_input, visible_every)
        self.max_payloads_per_step = limits.max_payloads_per_step
        self.max_visible_per_step = limits.max_visible_per_step
        self.num_steps = 0
        self.late_total_s = 0.0  # how far steps ran past their profile's deadline
        self.late_max_s = 0.0
        self.streams: dict[str, _Stream] = {}
        _live.add(self)

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits:
        """What one step emits with these params (the config is checked by it)."""
        steps, inputs = params["steps"], params["inputs_per_step"]
        outputs, every = params["outputs_per_input"], params["visible_every"]
        if not (
            isinstance(inputs, int)
            and isinstance(outputs, int)
            and isinstance(every, int)
            and (steps is None or isinstance(steps, int))
        ):
            raise TypeError("steps, inputs_per_step, outputs_per_input and visible_every are ints")
        return _step_limits(steps, inputs, outputs, every)

    @classmethod
    def step_cost(cls, params: Mapping[str, object]) -> StepCost:
        """What one step costs and yields with these params (headroom's prior for a
        first wave): its profile, with a stream's share of the replicas' work, and
        one unit a step (source mode, a talker, a window) or ``inputs_per_step``."""
        number = (int, float)
        names = ("service_time_ms", "per_stream_ms", "host_ms", "audio_samples")
        names += ("sample_rate_hz", "inputs_per_step", "outputs_per_input", "visible_every")
        values = {name: params[name] for name in names}
        if not all(isinstance(v, number) and not isinstance(v, bool) for v in values.values()):
            raise TypeError(f"{', '.join(names)} are numbers")
        replicas, frames, window = params["replicas"], params["frames_per_input"], params["window"]
        assert isinstance(replicas, int)
        assert frames is None or isinstance(frames, number)
        assert window is None or isinstance(window, int)
        source = params["steps"] is not None
        inputs = int(values["inputs_per_step"])
        units = 1 if source or frames is not None or window is not None else inputs
        steps_per_input = frames if frames is not None else 1 / (window or inputs)
        every = int(values["visible_every"])
        audio_s = 0.0
        if params["visible"] == "audio" and every:
            audio_s = units * float(values["audio_samples"]) / float(values["sample_rate_hz"])
            audio_s /= every
        return StepCost(
            step_s=(float(values["service_time_ms"]) + float(values["host_ms"]) * replicas) / 1000,
            per_stream_s=float(values["per_stream_ms"]) / 1000 / replicas,
            steps_per_input=float(steps_per_input),
            outputs_per_step=units * float(values["outputs_per_input"]),
            audio_s_per_step=audio_s,
        )

    @property
    def open_stream_ids(self) -> frozenset[str]:
        return frozenset(self.streams)

    def open_stream(self, stream_id: str, request: Request) -> None:
        knobs = request.options.knobs
        if knobs.get(f"{self.name}.fail_open"):
            raise SyntheticFailure(f"open_stream of {stream_id} failed on purpose")
        steps = knobs.get("steps", self.steps) if self.steps is not None else None
        limit = request.options.max_tokens
        if steps is not None and limit is not None:
            steps = min(int(steps), limit)
        fail_after = knobs.get(f"{self.name}.fail_after_units", self.fail_after_units)
        visible = knobs.get(f"{self.name}.visible", self.visible)
        if visible not in ("text", "audio", "trace"):
            raise ValueError(f"{self.name}.visible must be text, audio or trace, got {visible!r}")
        self.streams[stream_id] = _Stream(
            request,
            int(steps) if steps is not None else None,
            int(fail_after) if fail_after is not None else None,
            visible=str(visible),
        )

    def close_stream(self, stream_id: str) -> None:
        del self.streams[stream_id]

    def stage_statistics(self) -> Mapping[str, float]:
        """The streams it holds state for: readable from the supervisor wherever the
        stage runs (``live_streams`` sees this process only)."""
        return {"num_open_streams": float(len(self.streams))}

    def close(self) -> None:
        self.streams.clear()
        _live.discard(self)

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        self.num_steps += 1
        if self.gate is not None:
            self.gate.pass_through()
        working = len(batch) if self.window is None else sum(map(self._makes_window, batch))
        cost_s = (
            self.service_time_s
            + self.per_stream_s * math.ceil(working / self.replicas)
            + self._prefill_s(batch)
            if working
            else 0.0
        )
        now_s = time.perf_counter()
        if self._first_step_s is None:
            self._first_step_s = now_s
        if 0 <= now_s - self._first_step_s - self.slowdown_after_s < self.slowdown_for_s:
            cost_s *= self.slowdown
        deadline_s = now_s + cost_s
        # The outputs are built inside the step's budget, as a GPU stage's host work
        # overlaps its kernels: the step returns at its deadline, not after it.
        outputs = {work.stream_id: self._step_one(work, deadline_s) for work in batch}
        self._wait_until(deadline_s)
        if working and self.host_s:  # once per replica that stepped
            hold_gil_for(self.host_s * min(working, self.replicas))
        if self.fail_step_at is not None and self.num_steps == self.fail_step_at:
            raise SyntheticFailure(f"step {self.num_steps} of {self.name} failed on purpose")
        return outputs

    def _prefill_s(self, batch: Sequence[StreamWork]) -> float:
        """Prefill time of the streams in the batch that have no unit yet (source mode)."""
        if self.steps is None or not (self.prefill_s or self.prefill_per_word_s):
            return 0.0
        fresh = [self.streams[w.stream_id] for w in batch if self.streams[w.stream_id].units == 0]
        words = sum(len(state.request.text.split()) for state in fresh)
        return (self.prefill_s if fresh else 0.0) + self.prefill_per_word_s * words

    def _makes_window(self, work: StreamWork) -> bool:
        assert self.window is not None
        held = len(self.streams[work.stream_id].held) + len(work.inputs)
        return held >= self.window or (work.input_closed and held > 0)

    def _units_of(self, state: _Stream, work: StreamWork) -> tuple[Sequence[object], bool]:
        """The inputs this step makes units of (one unit each), and whether the stream
        needs another step without new input."""
        if state.steps_left is not None:  # source mode
            made = (None,) if state.steps_left > 0 else ()
            state.steps_left -= len(made)
            return made, state.steps_left > 0
        if self.frames_per_input is not None:  # one owed frame per step
            state.owed += self.frames_per_input * len(work.inputs)
            state.cause = work.inputs[-1] if work.inputs else state.cause
            if state.owed < 1 - 1e-9:
                return (), False
            state.owed -= 1
            return (state.cause,), state.owed >= 1 - 1e-9
        if self.window is not None:  # one unit per whole window
            state.held += work.inputs
            if len(state.held) < self.window and not (work.input_closed and state.held):
                return (), False
            window, state.held = state.held[: self.window], state.held[self.window :]
            more = len(state.held) >= self.window or (work.input_closed and bool(state.held))
            return (window[-1],), more
        return work.inputs, False

    def _step_one(self, work: StreamWork, deadline_s: float) -> StreamOutput:
        state = self.streams[work.stream_id]
        inputs, more = self._units_of(state, work)
        payloads: list[SyntheticPayload] = []
        visible: list[VisibleItem] = []
        for item in inputs:
            state.units += 1
            if state.fail_after_units is not None and state.units > state.fail_after_units:
                return StreamOutput(error=SyntheticFailure(f"unit {state.units} failed on purpose"))
            now = max(time.perf_counter(), deadline_s)  # produced when the step ends
            payloads += (
                SyntheticPayload(
                    work.stream_id, self.name, state.units, now, bytes(self.payload_bytes)
                )
                for _ in range(self.outputs_per_input)
            )
            if self.visible_every and state.units % self.visible_every == 0 and not visible:
                visible.append(self._visible(state.visible, state.units, item, now))
        done = not more and work.input_closed
        return StreamOutput(tuple(payloads), tuple(visible), more=more, done=done)

    def _visible(self, kind: str, unit: int, cause: object, now: float) -> VisibleItem:
        if kind == "text":
            return TextDelta(f"{self.name}:{unit} ")
        if kind == "audio":
            # Vectorized, as a real vocoder's output is a tensor: a GPU-like stage
            # must not spend GIL-holding Python time per sample.
            wave = 8000 * numpy.sin(numpy.arange(self.audio_samples) * (0.1 * unit))
            return AudioChunk(wave.astype("<i2").tobytes(), self.sample_rate_hz)
        upstream_s = cause.produced_s if isinstance(cause, SyntheticPayload) else None
        return Event(
            "trace",
            {
                "stage": self.name,
                "unit": unit,
                "produced_s": now,
                "upstream_produced_s": upstream_s,
            },
        )

    def _wait_until(self, deadline_s: float) -> None:
        """Return at ``deadline_s``; count how late a loaded machine still made the step."""
        if self.cpu_bound:
            while time.perf_counter() < deadline_s:
                pass
        else:
            # time.sleep wakes ~0.1 ms late (timer slack, wake-up latency), more on a
            # loaded machine: sleep until SLEEP_MARGIN_S before the deadline, then poll
            # the clock with zero-timeout selects. Each releases the GIL without giving
            # up the CPU or arming a timer, so the runtime's threads run as they would
            # beside a GPU kernel (a bare spin would hold the GIL).
            coarse_s = deadline_s - time.perf_counter() - SLEEP_MARGIN_S
            if coarse_s > 0:
                time.sleep(coarse_s)
            while time.perf_counter() < deadline_s:
                select.select([], [], [], 0)
        late_s = time.perf_counter() - deadline_s
        self.late_total_s += late_s
        self.late_max_s = max(self.late_max_s, late_s)
