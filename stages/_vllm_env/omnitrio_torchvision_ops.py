"""Stands in for one missing piece of the vLLM engine's environment (.venv-vllm only).

PyPI's torchvision is a CUDA build; beside vLLM's CPU torch its compiled operators do
not load, and its Python half then fails to import ("operator torchvision::nms does
not exist") while registering their shapes. vLLM's Qwen-Omni modules import
transformers' Qwen2-VL image processor, which imports ``torchvision.transforms.v2``.
PyTorch's CPU index, where vLLM's CPU install takes torchvision from, is not reachable
from every host (it is not from this project's CI).

This module declares those operators' names (no kernels: calling one raises), so the
Python half of torchvision imports and its transforms, which are plain torch, work.
``scripts/setup vllm`` runs it at interpreter start in .venv-vllm through a ``.pth``
file, and only where the installed torchvision is a CUDA build beside a CPU torch; it
edits no installed file. What it stands in for: torchvision's CPU build.
"""

from __future__ import annotations

import re
from importlib import metadata, util
from pathlib import Path

OPERATORS = (
    "nms",
    "qnms",
    "roi_align",
    "_roi_align_backward",
    "ps_roi_align",
    "_ps_roi_align_backward",
    "roi_pool",
    "_roi_pool_backward",
    "ps_roi_pool",
    "_ps_roi_pool_backward",
    "qroi_align",
    "deform_conv2d",
    "_deform_conv2d_backward",
)
_library = None  # kept alive: the declarations live as long as the library object


def versions() -> tuple[str, str]:
    """torch's and torchvision's versions as built ("2.13.0+cpu", "0.28.0+cu130"), without
    importing either; "" for one not installed. torchvision's wheel metadata omits its
    build tag, its version.py has it."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = ""
    spec = util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return torch_version, ""
    version_file = Path(spec.origin).with_name("version.py")
    text = version_file.read_text() if version_file.is_file() else ""
    found = re.search(r"__version__ = '([^']+)'", text)
    return torch_version, found.group(1) if found else ""


def needed() -> bool:
    """A CUDA torchvision beside a CPU torch (its operators cannot load)."""
    torch_version, vision_version = versions()
    return torch_version.endswith("+cpu") and "+cu" in vision_version


def declare() -> None:
    global _library
    if _library is not None:
        return
    import torch

    _library = torch.library.Library("torchvision", "DEF")
    for name in OPERATORS:
        _library.define(f"{name}(Tensor[] inputs) -> Tensor")


if needed():
    declare()
