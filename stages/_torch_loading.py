"""Loading a stage's weights from a local folder, loudly.

``from_pretrained`` quietly random-initialises any weight it does not find; a
serving stage must refuse that instead. A model id instead of a folder fails
with a message saying how to supply a local path (no hub access at run time).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any


class WeightsError(RuntimeError):
    """A stage's checkpoint folder is missing, or does not match the model's weights."""


def load_pretrained(model_class: Any, folder: str | Path, *, stage: str, **kwargs: Any) -> Any:
    """``model_class.from_pretrained(folder)`` in eval mode; any key mismatch is an error."""
    path = Path(folder)
    if not path.is_dir() and (path.parent / "config.json").is_file():
        raise WeightsError(
            f"stage {stage!r}: {str(path.parent)!r} has no {path.name}/ folder; a published "
            "(composite) checkpoint is split into one folder per stage once with "
            f"`omnitrio split-checkpoint {path.parent} DEST`, then served with --model-path DEST"
        )
    if not path.is_dir():
        raise WeightsError(
            f"stage {stage!r}: {str(folder)!r} is not a local folder; omnitrio never downloads "
            "weights: give the path of a checkpoint folder (e.g. --model-path DIR), or make a "
            "tiny one with `omnitrio make-tiny-model DIR`"
        )
    if not (path / "config.json").is_file():
        raise WeightsError(f"stage {stage!r}: {str(path)!r} has no config.json")
    model, info = model_class.from_pretrained(path, output_loading_info=True, **kwargs)
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(key) for key in info.get(kind) or ())
        if keys:
            shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
            problems.append(f"{kind.replace('_', ' ')}: {shown}")
    if problems:
        raise WeightsError(
            f"stage {stage!r}: checkpoint {str(path)!r} does not match "
            f"{model_class.__name__}: " + "; ".join(problems)
        )
    return model.eval()


def load_embedding(folder: str | Path, key: str, device: Any) -> Any:
    """One weight (an embedding matrix) of a folder's safetensors, without the model."""
    import json

    from safetensors import safe_open

    path = Path(folder)
    index = path / "model.safetensors.index.json"
    name = "model.safetensors"
    if index.is_file():
        name = json.loads(index.read_text())["weight_map"].get(key, name)
    if not (path / name).is_file():
        raise WeightsError(f"{str(path)!r} has no {name} (looking for {key})")
    with safe_open(str(path / name), framework="pt", device="cpu") as weights:
        if key not in weights.keys():  # noqa: SIM118 - safe_open has no __contains__
            raise WeightsError(f"{str(path / name)!r} has no weight {key!r}")
        return weights.get_tensor(key).to(device)


def keep_composite_files(source: Path, destination: Path) -> list[Path]:
    """Copy a published composite checkpoint's own files (its top: weights, configs,
    tokenizer, processor) to ``destination``'s top, the weights hard-linked where the
    file system allows; nothing when they are the same folder. A split keeps them: the
    vLLM thinker loads the composite there. Returns the top's files."""
    top = [file for file in sorted(Path(source).iterdir()) if file.is_file()]
    Path(destination).mkdir(parents=True, exist_ok=True)
    if Path(destination).resolve() != Path(source).resolve():
        for file in top:
            copy_file(file, Path(destination) / file.name, link=file.name.startswith("model"))
    return top


def copy_file(source: Path, destination: Path, *, link: bool = False) -> None:
    """A copy, or with ``link`` a hard link where the file system allows one."""
    destination.unlink(missing_ok=True)
    if link:
        try:
            os.link(source, destination)
            return
        except OSError:
            pass
    shutil.copyfile(source, destination)
