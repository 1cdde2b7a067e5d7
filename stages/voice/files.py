"""The voice-chat stages' model files: packaged weights found without importing their
packages, params that name a file, the CPU-only check."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def no_progress_monitor_thread() -> None:
    """tqdm (used by transformers and faster-whisper) starts a monitor thread on its first
    progress bar that lives until the process ends; a stage must leave no thread behind.
    Process-wide, and harmless: the monitor only fixes bars that stall."""
    import tqdm

    tqdm.tqdm.monitor_interval = 0


def package_dir(package: str, install_hint: str) -> Path:
    """The folder of an installed package, found without importing it (some of the
    weight packages import libraries we do not install)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {package!r} is not installed; install the voice extra: {install_hint}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


INSTALL_HINT = "scripts/setup voice"


class MissingModelFile(FileNotFoundError):
    """A stage param names a model file or folder that is not there."""


def cpu_only(stage: str, device: str) -> None:
    """A ``ValueError`` naming the stage unless ``device`` is ``cpu`` (ONNX/espeak stages)."""
    if device != "cpu":
        raise ValueError(f"stage {stage!r} runs on the CPU only; set device: cpu, not {device!r}")


def existing_path(param: str, path: str, *, folder: bool = False) -> Path:
    """``path`` (a stage param's value) if it exists, else ``MissingModelFile`` naming both."""
    found = Path(path).expanduser()
    if not (found.is_dir() if folder else found.is_file()):
        kind = "folder" if folder else "file"
        raise MissingModelFile(f"param {param}: no such {kind}: {found}")
    return found
