"""Shared by the Qwen2.5-Omni tests: one tiny checkpoint per session, and pipeline configs."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import omnitrio  # noqa: E402
from stages.qwen2_5_omni import make_tiny_checkpoint  # noqa: E402

CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "qwen2.5-omni-tiny.yaml"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("qwen2.5-omni-tiny")
    torch.set_num_threads(1)
    make_tiny_checkpoint(directory, seed=0)
    return directory


def tiny_config(
    checkpoint: pathlib.Path, **stage_params: dict[str, Any]
) -> omnitrio.PipelineConfig:
    """configs/qwen2.5-omni-tiny.yaml pointed at ``checkpoint``, with extra params per stage."""
    import yaml

    data = yaml.safe_load(CONFIG.read_text())
    for stage in data["stages"]:
        stage["params"]["checkpoint"] = str(checkpoint)
        stage["params"].update(stage_params.get(stage["name"], {}))
    return omnitrio.parse_config(data, source=str(CONFIG))
