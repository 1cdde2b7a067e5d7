"""Where a model stage's tensors live, and the rules for moving them.

A stage's ``device`` (``cpu``, ``cuda``, ``cuda:1``) comes from its config entry.
The rules every model stage follows:

- weights, KV caches and every tensor of a step stay on the stage's device;
- payloads to the next stage carry the producer's device tensors as they are. The
  consumer calls ``on(tensor, self.device)``: a no-op when both stages share the
  device (no host round trip), one device-to-device copy otherwise;
- only what a user sees (sampled ids for detokenisation, PCM audio) is copied to
  the host, once per step.

``stage_device`` checks the name early: a CUDA device on a machine without one
is refused at construction with a message naming the stage.
"""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """A stage's ``device`` is unknown or not present on this machine."""


def stage_device(stage: str, device: str) -> torch.device:
    """The ``torch.device`` for ``device``, or a ``DeviceError`` naming the stage."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise DeviceError(
            f"stage {stage!r}: device {device!r} is not a torch device (cpu, cuda, cuda:N)"
        ) from error
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"stage {stage!r}: device {device!r} needs a CUDA GPU and torch with CUDA; "
                "none is available here (torch.cuda.is_available() is False); set device: cpu"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise DeviceError(
                f"stage {stage!r}: device {device!r} does not exist; this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
        if resolved.index is None:  # tensors report cuda:N; compare like with like
            resolved = torch.device("cuda", torch.cuda.current_device())
    elif resolved.type != "cpu":
        raise DeviceError(f"stage {stage!r}: device {device!r} is not supported; use cpu or cuda")
    return resolved


def on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: itself when it is there already (a shared-device edge)."""
    return tensor if tensor.device == device else tensor.to(device)


def cuda_devices() -> int:
    """How many CUDA devices torch sees (0 without a GPU or without CUDA torch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
