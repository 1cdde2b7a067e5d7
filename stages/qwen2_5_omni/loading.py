"""Loading one stage's weights from its own folder, loudly.

The loud loading itself is shared (``stages/_torch_loading.py``); here are the
Qwen2.5-Omni specifics: the stage folders and the speaker dictionary. Each stage moves
its model to its device (``stages/_torch_device.py``).
"""

from __future__ import annotations

import pathlib
from typing import Any, TypeVar

import torch

from stages.kit import WeightsError, load_pretrained

M = TypeVar("M", bound=torch.nn.Module)

# A stage's folder does not hold exactly the weights its model class expects.
StageWeightsError = WeightsError


def stage_folder(checkpoint: str | pathlib.Path, stage: str) -> pathlib.Path:
    """``checkpoint/<stage>``, or a clear error saying how to make one."""
    root = pathlib.Path(checkpoint)
    folder = root / stage
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"stage {stage!r}: no Qwen2.5-Omni stage folder at {folder} (expected config.json "
            "there). Model ids are not downloaded: give a local checkpoint path, e.g. make a "
            f"tiny one with `omnitrio make-tiny-model {root} --family qwen2.5-omni`"
        )
    return folder


def load_stage_model(model_class: type[M], folder: pathlib.Path, stage: str) -> M:
    """``model_class.from_pretrained(folder)`` in eval mode, float32; any key problem is an
    error naming the stage and the keys (``stages/_torch_loading.py``)."""
    model: M = load_pretrained(model_class, folder, stage=stage, dtype=torch.float32)
    return model


def load_speakers(folder: pathlib.Path, stage: str) -> dict[str, dict[str, Any]]:
    """``spk_dict.pt``: speaker name -> {cond, ref_mel, bos_token}."""
    path = folder / "spk_dict.pt"
    if not path.is_file():
        raise FileNotFoundError(f"stage {stage!r}: no spk_dict.pt in {folder}")
    speakers: dict[str, dict[str, Any]] = torch.load(path, weights_only=True)
    return speakers


def speaker_of(asked: object, speakers: dict[str, Any], default: str) -> str:
    """The speaker ``asked`` (a request's ``speaker`` knob; None: ``default``), checked
    against the known speakers."""
    speaker = str(default if asked is None else asked)
    if speaker not in speakers:
        raise ValueError(f"unknown speaker {speaker!r}; known: {', '.join(sorted(speakers))}")
    return speaker
