"""8-bit weights for an ONNX model's matrix products (Moonshine's decoder).

Why: Moonshine's decoder makes one token per run, so each run multiplies one row by
every weight matrix: it reads all its weights once per token. Expanded to float32 at
load (moonshine.py), that is ~200 MB a token, ~15 ms on the 2-core machine, most of the
transcript's time. With the weights kept as 8 bits, each ``MatMul`` whose second input
is a constant 2-D matrix becomes onnxruntime's ``DynamicQuantizeMatMul``
(com.microsoft): the row is quantized to uint8 on the fly, the product is taken in
integers and scaled back: ~7 ms a token (docs/benchmarks-voice.md, issue 24).

The weights are quantized per output column, asymmetric uint8 (scale and zero point
per column): uint8 x uint8, because onnxruntime's x86 kernel for uint8 x int8 can
saturate on CPUs without VNNI. ``MatMul``s inside sub-graphs (the merged decoder's
``If`` branches) are rewritten too, whether the matrix is the sub-graph's own
initializer or the outer graph's. Nothing else changes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


def folded(path: Path) -> onnx.ModelProto:
    """The model at ``path`` with its constant expressions folded (onnxruntime's basic
    graph optimizations, saved back as ONNX): expanded weights become plain float32
    initializers."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as scratch:
        options.optimized_model_filepath = os.path.join(scratch, "folded.onnx")
        onnxruntime.InferenceSession(str(path), options, ["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def quantize_columns(
    weight: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
    """``weight`` ([K, N]) as uint8 with a scale and zero point per column N, the range
    of each column stretched to include 0 (so that 0 is exact)."""
    low = np.minimum(weight.min(axis=0), 0.0)
    high = np.maximum(weight.max(axis=0), 0.0)
    scale = np.maximum((high - low) / 255.0, np.finfo(np.float32).tiny).astype(np.float32)
    zero = np.clip(np.round(-low / scale), 0, 255).astype(np.uint8)
    quantized = np.clip(np.round(weight / scale) + zero, 0, 255).astype(np.uint8)
    return quantized, scale, zero


# An initializer, the graph holding it and that graph's path in the model (a Python
# object's id would not do: protobuf hands out a new wrapper for a sub-graph each time)
_Owned = tuple[onnx.TensorProto, onnx.GraphProto, str]


class _Rewriter:
    """Rewrites one model's constant-matrix MatMuls, graph by graph."""

    def __init__(self) -> None:
        self.num_rewritten = 0
        # A weight's 8-bit initializers, made once and kept beside the original (in the
        # graph that holds it, by name and that graph's path), so that both branches of
        # an If share one copy of an outer weight.
        self.made: dict[tuple[str, str], tuple[str, str, str]] = {}

    def graph(self, graph: onnx.GraphProto, outer: dict[str, _Owned], path: str = "") -> None:
        own = {init.name: (init, graph, path) for init in graph.initializer}
        visible = {**outer, **own}
        nodes: list[onnx.NodeProto] = []
        for number, node in enumerate(graph.node):
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    self.graph(attribute.g, visible, f"{path}/{number}.{attribute.name}")
            owned = visible.get(node.input[1]) if node.op_type == "MatMul" else None
            if owned is None or not _is_float_matrix(owned[0]):
                nodes.append(node)
                continue
            init, holder, where = owned
            key = (init.name, where)
            if key not in self.made:
                names = (f"{init.name}_u8", f"{init.name}_u8_scale", f"{init.name}_u8_zero")
                arrays = quantize_columns(numpy_helper.to_array(init).astype(np.float32))
                holder.initializer.extend(
                    numpy_helper.from_array(a, n) for a, n in zip(arrays, names, strict=True)
                )
                self.made[key] = names
            nodes.append(
                helper.make_node(
                    "DynamicQuantizeMatMul",
                    [node.input[0], *self.made[key]],
                    list(node.output),
                    name=f"{node.name or node.output[0]}_u8",
                    domain=MS_DOMAIN,
                )
            )
            self.num_rewritten += 1
        del graph.node[:]
        graph.node.extend(nodes)


def _is_float_matrix(init: onnx.TensorProto) -> bool:
    return len(init.dims) == 2 and init.data_type == onnx.TensorProto.FLOAT


def with_u8_matmuls(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` (changed in place) with every constant-matrix ``MatMul`` on 8-bit
    weights, and how many were rewritten."""
    rewriter = _Rewriter()
    rewriter.graph(model.graph, {})
    graphs = _all_graphs(model.graph)
    used = {name for graph in graphs for node in graph.node for name in node.input}
    used |= {output.name for graph in graphs for output in graph.output}
    for graph in graphs:  # the float matrices no node reads any more
        kept = [init for init in graph.initializer if init.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    if not any(opset.domain == MS_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model, rewriter.num_rewritten


def _all_graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    graphs = [graph]
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                graphs += _all_graphs(attribute.g)
    return graphs


# Signed weights for CPUs with VNNI -------------------------------------------------
#
# onnxruntime's x86 kernels multiply uint8 rows by int8 weights with the VNNI
# instruction (vpdpbusd: four u8 x s8 products summed into int32, no saturation)
# where the CPU has it (AVX512-VNNI or AVX-VNNI); its kernels for uint8 weights do
# not use it. A uint8 weight w with zero point z is the int8 weight w - 128 with zero
# point z - 128: every (w - z) is the same integer, so the integer products, and the
# float results scaled from them, are the same bit for bit. Without VNNI the u8 x s8
# kernel sums pairs into int16 and can saturate, hence the unsigned default.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")


def cpu_has_vnni(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has VNNI (``/proc/cpuinfo``'s flags; False where it cannot be
    read)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as info:
                cpuinfo = info.read()
        except OSError:
            return False
    flags = {
        flag
        for line in cpuinfo.splitlines()
        if line.startswith("flags")
        for flag in line.partition(":")[2].split()
    }
    return any(flag in flags for flag in VNNI_FLAGS)


def with_s8_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` (changed in place) with each ``DynamicQuantizeMatMul``'s uint8 weight
    and zero point stored as int8 (both minus 128: the same products), and how many
    products read them."""
    graphs = _all_graphs(model.graph)
    initializers = {init.name: init for graph in graphs for init in graph.initializer}
    shifted: set[str] = set()
    count = 0
    for graph in graphs:
        for node in graph.node:
            if node.op_type != "DynamicQuantizeMatMul" or node.domain != MS_DOMAIN:
                continue
            if len(node.input) < 4 or not node.input[3]:
                raise ValueError(f"{node.name}: no zero point (int8 weights need one)")
            count += 1
            for name in (node.input[1], node.input[3]):
                if name in shifted:
                    continue
                init = initializers[name]
                if init.data_type != onnx.TensorProto.UINT8:
                    raise ValueError(f"{node.name}: {name} is not uint8")
                values = numpy_helper.to_array(init).astype(np.int16) - 128
                init.CopyFrom(numpy_helper.from_array(values.astype(np.int8), name))
                shifted.add(name)
    return model, count
