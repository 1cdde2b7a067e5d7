"""onnx_u8.py: constant-matrix MatMuls on 8-bit weights, in the main graph and in an
If's branches (Moonshine's merged decoder has both), computing what the float model
does to within the quantization's error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from stages.voice.onnx_u8 import (
    cpu_has_vnni,
    quantize_columns,
    with_s8_weights,
    with_u8_matmuls,
)


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


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    graphs = [model.graph] + [
        a.g for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
    ]
    return {i.name: numpy_helper.to_array(i) for g in graphs for i in g.initializer}


def test_signed_weights_keep_every_weight_minus_its_zero_point() -> None:
    rng = np.random.default_rng(2)
    quantized, _ = with_u8_matmuls(_model(rng))
    before = _initializers(quantized)
    signed, num = with_s8_weights(onnx.load_from_string(quantized.SerializeToString()))
    assert num == 3  # the three products; W's shared copy shifted once
    onnx.checker.check_model(signed)
    after = _initializers(signed)
    for name in ("W", "V"):
        weight, zero = after[f"{name}_u8"], after[f"{name}_u8_zero"]
        assert weight.dtype == zero.dtype == np.int8
        np.testing.assert_array_equal(  # (w - z) the same integers: the same products
            weight.astype(np.int32) - zero.astype(np.int32),
            before[f"{name}_u8"].astype(np.int32) - before[f"{name}_u8_zero"].astype(np.int32),
        )
        np.testing.assert_array_equal(after[f"{name}_u8_scale"], before[f"{name}_u8_scale"])
    if not cpu_has_vnni():
        pytest.skip("no VNNI: onnxruntime's u8 x s8 kernel may saturate on this CPU")
    x = rng.standard_normal((1, 16)).astype(np.float32)
    for flag in (True, False):  # bit for bit what the unsigned weights give
        np.testing.assert_array_equal(_run(signed, x, flag), _run(quantized, x, flag))


def test_vnni_is_read_from_the_cpus_flags() -> None:
    line = "flags\t\t: fpu sse2 avx2 avx512f {}\n"
    assert cpu_has_vnni("processor\t: 0\n" + line.format("avx512_vnni avx512bw"))
    assert cpu_has_vnni(line.format("avx_vnni"))
    assert not cpu_has_vnni(line.format("avx512bw"))
    assert not cpu_has_vnni("")
