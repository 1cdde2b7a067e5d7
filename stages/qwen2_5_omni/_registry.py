"""Live stage objects by name, so tests and benchmarks can read their ``statistics()``.

The runtime owns the stage objects; this only keeps weak references to them.
"""

from __future__ import annotations

import weakref
from typing import Any

_live: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def register(stage: Any) -> None:
    _live[stage.name] = stage


def live_stage(name: str) -> Any:
    """The most recently constructed live stage called ``name`` (KeyError if none)."""
    return _live[name]
