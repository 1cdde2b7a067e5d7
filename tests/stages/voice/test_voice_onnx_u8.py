"""onnx_u8.py: constant-matrix MatMuls on 8-bit weights, in the main graph and in an
If's branches (Moonshine's merged decoder has both), computing what the float model
does to within the quantization's error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from stages.voice.onnx_u8 import quantize_columns, with_u8_matmuls


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """y = If(flag, then: (x @ W) @ V, else: x @ W), V the then-branch's own matrix."""
    weight = rng.standard_normal((16, 32)).astype(np.float32)
    own = rng.standard_normal((32, 8)).astype(np.float32)
    then_branch = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("MatMul", ["h", "V"], ["then_y"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [1, 8])],
        initializer=[numpy_helper.from_array(own, "V")],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h2"]),
            helper.make_node("Slice", ["h2", "starts", "ends", "axes"], ["else_y"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, [1, 8])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(np.array([0], np.int64), "starts"),
            numpy_helper.from_array(np.array([8], np.int64), "ends"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray, flag: bool) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(None, {"x": x, "flag": np.array(flag)})
    return np.asarray(y)


def test_every_constant_matrix_product_runs_on_8_bits_and_computes_the_same() -> None:
    rng = np.random.default_rng(0)
    model = _model(rng)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    expected = {flag: _run(model, x, flag) for flag in (True, False)}
    quantized, num = with_u8_matmuls(onnx.load_from_string(model.SerializeToString()))
    assert num == 3  # W in both branches (one shared copy), V in its own
    onnx.checker.check_model(quantized)
    outer = {init.name for init in quantized.graph.initializer}
    assert "W" not in outer  # the float matrix is gone, its 8-bit copy is shared
    assert {"W_u8", "W_u8_scale", "W_u8_zero"} <= outer
    for flag in (True, False):
        got = _run(quantized, x, flag)
        scale = np.abs(expected[flag]).max()
        assert np.abs(got - expected[flag]).max() < 0.03 * scale, flag


@pytest.mark.parametrize("shift", [0.0, 3.0, -3.0])
def test_columns_quantize_with_zero_exact_and_each_its_own_scale(shift: float) -> None:
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((64, 4)) * np.array([0.01, 1.0, 10.0, 100.0]) + shift).astype(
        np.float32
    )
    weight[0, :] = 0.0
    quantized, scale, zero = quantize_columns(weight)
    restored = (quantized.astype(np.float32) - zero.astype(np.float32)) * scale
    assert np.all(restored[0, :] == 0.0)  # 0 stays 0
    assert np.all(np.abs(restored - weight) <= 0.5 * scale + 1e-6)  # half a step per column
