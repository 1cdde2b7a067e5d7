"""What ``omnitrio bench`` changes in a config before it runs: ``--set``, ``--cpu-bound``,
``--host-ms`` and ``--placement``, each a copy of the config."""

from __future__ import annotations

from pathlib import Path

import yaml

from omnitrio import PipelineConfig, parse_config

SYNTHETIC_IMPL = "stages.synthetic:SyntheticStage"


def with_params(path: Path, settings: list[str]) -> PipelineConfig:
    """The config at ``path`` with ``STAGE.PARAM=VALUE`` overrides applied, validated."""
    data = yaml.safe_load(path.read_text())
    for setting in settings:
        key, sep, raw = setting.partition("=")
        stage_name, dot, param = key.partition(".")
        stages = data.get("stages") if isinstance(data, dict) else None
        stage = next((s for s in stages or () if s.get("name") == stage_name), None)
        if not sep or not dot or stage is None:
            raise ValueError(
                f"--set {setting!r}: give STAGE.PARAM=VALUE with a stage of the config"
            )
        stage.setdefault("params", {})[param] = yaml.safe_load(raw)
    return parse_config(data, source=f"{path} (with --set)")


def with_cpu_bound(config: PipelineConfig) -> PipelineConfig:
    """``config`` with every synthetic stage busy-waiting instead of sleeping."""
    stages = tuple(
        s.model_copy(update={"params": {**s.params, "cpu_bound": True}})
        if s.impl == SYNTHETIC_IMPL
        else s
        for s in config.stages
    )
    return config.model_copy(update={"stages": stages})


def with_host_ms(config: PipelineConfig, host_ms: float | None) -> PipelineConfig:
    """``config`` with every synthetic stage's ``host_ms`` set (unchanged for None)."""
    if host_ms is None:
        return config
    stages = tuple(
        s.model_copy(update={"params": {**s.params, "host_ms": host_ms}})
        if s.impl == SYNTHETIC_IMPL
        else s
        for s in config.stages
    )
    return config.model_copy(update={"stages": stages})


def with_placement(config: PipelineConfig, placement: str) -> PipelineConfig:
    """``config`` with every stage placed so (the baselines place their own)."""
    stages = tuple(s.model_copy(update={"placement": placement}) for s in config.stages)
    return config.model_copy(update={"stages": stages})
