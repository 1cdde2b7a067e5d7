"""A test-only wrapper that injects faults into a real stage.

``FaultInjector`` builds the stage named by ``impl`` with ``params`` and passes
every call through, except where a request asks for a fault with these options
(counted in that stream's steps at this stage, from 1):

- ``fault.stream_error_at: N`` — the stream's N-th step returns an error for that
  stream only (the stage's own work for the other streams goes on);
- ``fault.step_raise_at: N`` — the step that would be the stream's N-th raises,
  failing the whole batch;
- ``fault.hang_at: N`` with ``fault.hang_s: S`` — that step blocks the stage
  thread for S seconds (for watchdog tests; bounded so the thread ends).

Config::

    - name: talker
      impl: stages.faults:FaultInjector
      params: {impl: "stages.qwen3_omni.talker:Qwen3OmniTalker", params: {...}}
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omnitrio import Request, StepLimits, StreamOutput, StreamWork


class InjectedFault(RuntimeError):
    """The failure a FaultInjector injects on purpose."""


@dataclass(frozen=True)
class _Plan:
    stream_error_at: int | None = None
    step_raise_at: int | None = None
    hang_at: int | None = None
    hang_s: float = 0.0

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> _Plan:
        def number(key: str) -> Any:
            value = options.get(f"fault.{key}")
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ValueError(f"option 'fault.{key}' must be a number, not {value!r}")
            return value

        return cls(
            number("stream_error_at"),
            number("step_raise_at"),
            number("hang_at"),
            float(number("hang_s") or 0.0),
        )


def _factory(impl: str) -> Any:
    module, _, attr = impl.partition(":")
    return getattr(importlib.import_module(module), attr)


class FaultInjector:
    @classmethod
    def step_limits(cls, params: Mapping[str, Any]) -> StepLimits | None:
        """The wrapped stage's declared limits for its params (its constructor's
        defaults filled in), or None where it declares none (checked when it loads)."""
        factory = _factory(params["impl"])
        given = params["params"] or {}
        declared = getattr(factory, "step_limits", None)
        if callable(declared):
            defaults = {
                n: p.default
                for n, p in inspect.signature(factory).parameters.items()
                if p.default is not inspect.Parameter.empty and n not in ("name", "device")
            }
            limits: StepLimits | None = declared({**defaults, **given})
            return limits
        return StepLimits.of_attributes(factory)

    def __init__(
        self, name: str, device: str = "cpu", *, impl: str, params: Mapping[str, Any] | None = None
    ) -> None:
        factory = _factory(impl)
        self.inner = factory(name=name, device=device, **(params or {}))
        self.max_inputs_per_step = self.inner.max_inputs_per_step
        self.max_payloads_per_step = self.inner.max_payloads_per_step
        self.max_visible_per_step = self.inner.max_visible_per_step
        self._plans: dict[str, _Plan] = {}
        self._num_steps: dict[str, int] = {}

    def open_stream(self, stream_id: str, request: Request) -> None:
        self._plans[stream_id] = _Plan.from_options(request.options.knobs)
        self._num_steps[stream_id] = 0
        self.inner.open_stream(stream_id, request)

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        failing = set()
        for work in batch:
            self._num_steps[work.stream_id] += 1
            count, plan = self._num_steps[work.stream_id], self._plans[work.stream_id]
            if plan.step_raise_at == count:
                raise InjectedFault(f"step raised for stream {work.stream_id} (step {count})")
            if plan.hang_at == count:
                time.sleep(plan.hang_s)
            if plan.stream_error_at == count:
                failing.add(work.stream_id)
        outputs = dict(self.inner.step([w for w in batch if w.stream_id not in failing]))
        for stream_id in failing:
            outputs[stream_id] = StreamOutput(
                error=InjectedFault(
                    f"stream {stream_id} failed at its step {self._num_steps[stream_id]}"
                )
            )
        return outputs

    def close_stream(self, stream_id: str) -> None:
        self._plans.pop(stream_id, None)
        self._num_steps.pop(stream_id, None)
        self.inner.close_stream(stream_id)

    def close(self) -> None:
        self.inner.close()

    def stage_statistics(self) -> Mapping[str, float]:
        report = getattr(self.inner, "stage_statistics", None)
        return {} if report is None else report()
