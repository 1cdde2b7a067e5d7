"""The vLLM engine's environment: the torchvision stand-in (stages/_vllm_env/) and the
engine process's frames (stages/_vllm_worker.py), without vLLM where they can be."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from stages._vllm_engine import VllmEngine, engine_python
from stages._vllm_worker import read_frame, write_frame

REPO = Path(__file__).resolve().parents[2]
ENV_DIR = REPO / "stages" / "_vllm_env"


def test_frames_round_trip_and_end_at_eof() -> None:
    buffer = io.BytesIO()
    write_frame(buffer, ("step", ()))
    write_frame(buffer, ("ok", [("s0", [1, 2], False, None, None)]))
    buffer.seek(0)
    assert read_frame(buffer) == ("step", ())
    assert read_frame(buffer) == ("ok", [("s0", [1, 2], False, None, None)])
    assert read_frame(buffer) is None  # the other side closed


def test_a_compiled_engine_with_hidden_layers_is_refused_before_it_starts() -> None:
    """A compiled model runs no forward hooks, so the prompt states would never come."""
    with pytest.raises(ValueError, match="hidden_layers need the eager model"):
        VllmEngine.start("no-such-model", hidden_layers=[0, 1], compiled=True)


def test_the_stand_in_declares_the_operators_torchvision_registers_shapes_for() -> None:
    """In a fresh interpreter with torch: declare(), then each operator exists (no kernel)."""
    pytest.importorskip("torch")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import omnitrio_torchvision_ops as m;"
        "m.declare(); m.declare(); import torch;"
        "assert all(hasattr(torch.ops.torchvision, n) for n in m.OPERATORS)"
    )
    subprocess.run([sys.executable, "-c", code, str(ENV_DIR)], check=True, timeout=120)


def test_the_stand_in_acts_only_for_a_cuda_torchvision_beside_a_cpu_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sys.path.insert(0, str(ENV_DIR))
    try:
        import omnitrio_torchvision_ops as ops
    finally:
        sys.path.remove(str(ENV_DIR))
    versions = {"torch": "2.13.0+cpu", "torchvision": "0.28.0+cu130"}
    monkeypatch.setattr(ops, "versions", lambda: (versions["torch"], versions["torchvision"]))
    assert ops.needed()
    versions["torchvision"] = "0.28.0+cpu"  # a CPU build: its own operators load
    assert not ops.needed()
    versions["torch"], versions["torchvision"] = "2.13.0", "0.28.0"  # CUDA both
    assert not ops.needed()
    versions["torchvision"] = ""  # none installed
    assert not ops.needed()


def test_in_the_engine_environment_torchvision_and_vllm_import() -> None:
    """Where scripts/setup vllm made .venv-vllm: its torchvision imports (the stand-in
    runs from the .pth file) and so does vLLM's Qwen3-Omni thinker module."""
    try:
        python = engine_python()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    code = (
        "import torchvision.transforms.v2, vllm.model_executor.models.qwen3_omni_moe_thinker;"
        "import vllm; print(vllm.__version__)"
    )
    done = subprocess.run(
        [str(python), "-c", code], check=True, timeout=300, capture_output=True, text=True
    )
    assert done.stdout.strip().splitlines()[-1] == "0.32.0"


def test_the_hidden_state_hooks_refuse_a_vllm_they_were_not_checked_against() -> None:
    """The hooks rely on vLLM 0.32.0's internals (the model runner's batch): another
    version is refused by name before any hook is placed."""
    try:
        python = engine_python()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import vllm; vllm.__version__ = '0.99.0';"
        "from _vllm_worker import _StateHooks\n"
        "try:\n    _StateHooks(None, [0])\nexcept RuntimeError as exc:\n    print(exc)"
    )
    done = subprocess.run(
        [str(python), "-c", code, str(REPO / "stages")],
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert "rely on vLLM 0.32.0 internals" in done.stdout
    assert "has vLLM 0.99.0" in done.stdout
