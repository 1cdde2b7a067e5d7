"""Stage objects for the baselines: the very classes and parameters a config names."""

from __future__ import annotations

from typing import Any

from omnitrio import PipelineConfig, Stage, StageLoadError, resolve_impl


def load_stage(config: PipelineConfig, index: int) -> Stage:
    """The ``index``-th configured stage object, built as omnitrio builds it.

    Blocking (a stage loads its weights here); call it from a thread.
    """
    spec = config.stages[index]
    factory: Any = resolve_impl(spec.impl, config.source, f"stage {spec.name}.impl")
    stage = factory(name=spec.name, device=spec.device, **spec.params)
    if not isinstance(stage, Stage):
        raise StageLoadError(spec.name, f"{spec.impl} does not implement the Stage protocol")
    return stage


def load_stages(config: PipelineConfig) -> list[Stage]:
    """One stage object per configured stage, in chain order (blocking)."""
    return [load_stage(config, index) for index in range(len(config.stages))]
