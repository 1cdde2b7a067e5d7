"""Stage objects for the baselines: the very classes and parameters a config names."""

from __future__ import annotations

from typing import Any

from .._config import PipelineConfig, resolve_impl
from .._errors import StageLoadError
from .._stage import Stage


def load_stages(config: PipelineConfig) -> list[Stage]:
    """One stage object per configured stage, in chain order, built as omnitrio builds them.

    Blocking (stages load their weights here); call it from a thread.
    """
    stages: list[Stage] = []
    for spec in config.stages:
        factory: Any = resolve_impl(spec.impl, config.source, f"stage {spec.name}.impl")
        stage = factory(name=spec.name, device=spec.device, **spec.params)
        if not isinstance(stage, Stage):
            raise StageLoadError(spec.name, f"{spec.impl} does not implement the Stage protocol")
        stages.append(stage)
    return stages
