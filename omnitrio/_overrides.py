"""Changes to a loaded config that the command line asks for: ``--model-path`` and
``--ray-address``. Used by ``omnitrio run`` and ``prompt`` (``_cli.py``) and by
``omnitrio bench`` (``benchmarks/harness/cli.py``), so neither command line imports the other.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ._config import PipelineConfig, resolve_impl, uses_ray
from ._errors import ConfigError
from ._stage import StageDeclarations

MODEL_PATH_HELP = (
    "a local model for the stages that load one: DIR gives every such stage the same "
    "checkpoint folder (refused where the stages each take their own model); "
    "STAGE=PATH gives one stage its model (repeatable)"
)


def with_model_path_arg(config: PipelineConfig, value: str) -> PipelineConfig:
    """``config`` with one ``--model-path`` applied: ``STAGE=PATH`` (a stage of the
    pipeline) or ``DIR`` (see ``with_model_path``)."""
    stage, sep, path = value.partition("=")
    if sep and stage in {s.name for s in config.stages}:
        return with_model_path(config, Path(path), stage=stage)
    return with_model_path(config, Path(value))


def _takes_model_path(config: PipelineConfig) -> dict[str, str | None]:
    """Each stage that takes a ``model_path`` param: the checkpoint it declares
    (its class's ``checkpoint``; None: the stage takes a model of its own)."""
    takes = {}
    for spec in config.stages:
        factory = resolve_impl(spec.impl, config.source, "impl")
        if "model_path" in inspect.signature(factory).parameters:
            takes[spec.name] = StageDeclarations.of(factory).checkpoint
    return takes


def with_model_path(
    config: PipelineConfig, model_path: Path, *, stage: str | None = None
) -> PipelineConfig:
    """``config`` with ``params.model_path`` set on ``stage``, or (``stage`` None) on
    every stage that takes one. Several stages share one folder only where they
    declare one checkpoint (a class attribute, ``checkpoint = "qwen3-omni"``: each reads
    its part of the folder); stages that each take their own model (the voice chat's
    ASR and LLM) make one folder for all ambiguous: refused, naming the stages."""
    flag = "--model-path" if stage is None else f"--model-path {stage}=..."
    if not model_path.exists() or (stage is None and not model_path.is_dir()):
        raise ConfigError(
            str(model_path),
            flag,
            "no such folder; give a local model folder"
            if stage is None
            else "no such file or folder; give the stage's local model",
        )
    takes = _takes_model_path(config)
    if stage is not None and stage not in takes:
        raise ConfigError(
            config.source, flag, f"stage {stage!r} takes no model_path; drop it, or name another"
        )
    if not takes:
        raise ConfigError(
            config.source,
            flag,
            f"no stage of pipeline {config.pipeline.name!r} loads a model; drop --model-path, "
            "or pick a pipeline whose stages take one with --config",
        )
    checkpoints = set(takes.values())
    if stage is None and len(takes) > 1 and (None in checkpoints or len(checkpoints) > 1):
        names = " and ".join(repr(n) for n in takes)
        raise ConfigError(
            config.source,
            flag,
            f"ambiguous on pipeline {config.pipeline.name!r}: stages {names} each take a "
            f"model_path of their own; name the stage, e.g. --model-path {list(takes)[-1]}=PATH "
            "(repeatable)",
        )
    chosen = set(takes) if stage is None else {stage}
    stages = tuple(
        s.model_copy(update={"params": {**s.params, "model_path": str(model_path)}})
        if s.name in chosen
        else s
        for s in config.stages
    )
    return config.model_copy(update={"stages": stages})


def with_ray_address(config: PipelineConfig, address: str) -> PipelineConfig:
    """``config`` with ``pipeline.ray_address`` set (its stages with ``placement: ray``
    join that cluster instead of a Ray instance started for the pipeline)."""
    if not address:
        raise ConfigError(config.source, "--ray-address", "empty; give the cluster's address")
    if not uses_ray(config):
        raise ConfigError(
            config.source,
            "--ray-address",
            f"no stage of pipeline {config.pipeline.name!r} has placement: ray; drop "
            "--ray-address, or set placement: ray on the stages to place on the cluster",
        )
    pipeline = config.pipeline.model_copy(update={"ray_address": address})
    return config.model_copy(update={"pipeline": pipeline})
