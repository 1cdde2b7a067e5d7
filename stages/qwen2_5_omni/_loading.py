"""Loading one stage's weights from its own folder, loudly.

``from_pretrained`` fills any weight it does not find with a random init and only
says so in its loading info; a stage that silently serves random weights is the
worst failure there is. ``load_stage_model`` turns missing, unexpected or
mismatched keys into a ``StageWeightsError`` that names the stage and the keys.
"""

from __future__ import annotations

import pathlib
from typing import Any, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)

_MAX_KEYS_SHOWN = 8


class StageWeightsError(RuntimeError):
    """A stage's folder does not hold exactly the weights its model class expects."""


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


def check_device(stage: str, device: str) -> None:
    """The Qwen2.5-Omni stages build their step tensors on the CPU; other devices are refused."""
    if device != "cpu":
        raise ValueError(
            f"stage {stage!r}: device {device!r} is not supported yet by the Qwen2.5-Omni "
            "stages (they run on cpu); set device: cpu"
        )


def load_stage_model(model_class: type[M], folder: pathlib.Path, stage: str) -> M:
    """``model_class.from_pretrained(folder)`` in eval mode; any key problem is an error."""
    loaded: Any = model_class.from_pretrained(  # type: ignore[attr-defined]
        folder, output_loading_info=True, dtype=torch.float32
    )
    model, info = loaded
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(k) for k in info.get(kind) or ())
        if keys:
            shown = ", ".join(keys[:_MAX_KEYS_SHOWN])
            more = f" and {len(keys) - _MAX_KEYS_SHOWN} more" if len(keys) > _MAX_KEYS_SHOWN else ""
            problems.append(f"{kind.replace('_', ' ')}: {shown}{more}")
    if problems:
        raise StageWeightsError(
            f"stage {stage!r}: weights in {folder} do not match {model_class.__name__} "
            f"({'; '.join(problems)}); save each stage to its own folder "
            "(see stages/qwen2_5_omni/_tiny.py)"
        )
    return model.eval()  # type: ignore[no-any-return]


def load_speakers(folder: pathlib.Path, stage: str) -> dict[str, dict[str, Any]]:
    """``spk_dict.pt``: speaker name -> {cond, ref_mel, bos_token}."""
    path = folder / "spk_dict.pt"
    if not path.is_file():
        raise FileNotFoundError(f"stage {stage!r}: no spk_dict.pt in {folder}")
    speakers: dict[str, dict[str, Any]] = torch.load(path, weights_only=True)
    return speakers


def speaker_of(options: Any, speakers: dict[str, Any], default: str) -> str:
    """The request's ``speaker`` option, checked against the known speakers."""
    speaker = str(options.get("speaker", default))
    if speaker not in speakers:
        raise ValueError(f"unknown speaker {speaker!r}; known: {', '.join(sorted(speakers))}")
    return speaker
