"""What the voice-chat stages share: edge payloads, PCM conversion, packaged files.

The payloads travel only on the edges asr -> llm -> tts; clients never see them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Utterance:
    """asr -> llm: what the user said in this turn ("" when the turn had no audio)."""

    text: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    """llm -> tts: the next piece of the answer's text, in order."""

    text: str


def pcm16_to_float(pcm16: bytes) -> Floats:
    """Little-endian PCM16 bytes as float32 samples in [-1, 1]."""
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0


def float_to_pcm16(samples: Floats) -> bytes:
    """float32 samples (clipped to [-1, 1]) as little-endian PCM16 bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


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
