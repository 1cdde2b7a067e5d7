"""The model families installed beside the runtime, found by their packages: the
runtime's CLI names none of their modules.

A family is a package under ``stages`` whose ``__init__`` names it (``FAMILY =
"qwen3-omni"``). One with a ``tiny`` module registers a tiny-model builder by it:
``tiny.make_tiny_checkpoint(directory, *, seed)`` (``omnitrio make-tiny-model``) and,
optionally, ``tiny.split_checkpoint(source, destination)`` (``omnitrio
split-checkpoint``). Finding them imports only the packages' ``__init__`` (no torch);
a ``tiny`` module loads when a command uses it.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType

STAGES_PACKAGE = "stages"


def tiny_model_builders() -> dict[str, str]:
    """Each installed family with a tiny-model builder: its name -> its ``tiny`` module."""
    try:
        package = importlib.import_module(STAGES_PACKAGE)
    except ImportError:
        return {}
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__, prefix=f"{STAGES_PACKAGE}."):
        if not info.ispkg:
            continue
        family = getattr(importlib.import_module(info.name), "FAMILY", None)
        if isinstance(family, str) and importlib.util.find_spec(f"{info.name}.tiny"):
            found[family] = f"{info.name}.tiny"
    return found


def tiny_model_builder(family: str) -> ModuleType:
    """The ``tiny`` module of ``family`` (the model stack, torch, loads here)."""
    return importlib.import_module(tiny_model_builders()[family])
