"""The model families found beside the runtime (``omnitrio/_families.py``): each registers
its tiny-model builder by its package, and the CLI offers exactly those."""

from __future__ import annotations

import argparse

from omnitrio._cli import _parser
from omnitrio._families import tiny_model_builders


def test_each_family_with_a_tiny_module_registers_its_builder() -> None:
    assert tiny_model_builders() == {
        "qwen2.5-omni": "stages.qwen2_5_omni.tiny",
        "qwen3-omni": "stages.qwen3_omni.tiny",
    }


def test_the_cli_offers_the_registered_families() -> None:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("make-tiny-model", "split-checkpoint"):
        family = next(a for a in commands.choices[command]._actions if a.dest == "family")
        assert family.choices == ["qwen2.5-omni", "qwen3-omni"]
        assert family.default == "qwen3-omni"
