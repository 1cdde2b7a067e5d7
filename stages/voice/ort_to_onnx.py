"""Rewrite an onnxruntime ``.ort`` model (its flatbuffer format) as a plain ONNX model.

Why: the Moonshine weights ship only as ``.ort`` files (``moonshine-cpp``), whose
8-bit weights are stored as ``int8`` tensors expanded by ``Cast`` and ``Mul`` nodes.
An ``.ort`` file is loaded without graph optimizations, so that expansion runs on
every call (every decoder step). The same graph as ``.onnx`` gets onnxruntime's
constant folding at load: the weights are expanded once.

The flatbuffer is read with the reader onnxruntime ships
(``onnxruntime.tools.ort_format_model``); every node, attribute (sub-graphs too),
initializer and value type is copied one to one into an ``onnx.ModelProto``.
Nothing is changed, so the converted model computes exactly what the shipped one
does (tests/stages/voice/test_voice_moonshine.py checks it).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.AttributeType import (
    AttributeType,
)
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.DimensionValueType import (
    DimensionValueType,
)
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.InferenceSession import (
    InferenceSession,
)
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.NodeType import NodeType
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.TypeInfoValue import (
    TypeInfoValue,
)

# The flatbuffer classes are generated code without type hints: Any below.
Fb = Any


class OrtFormatError(ValueError):
    """The ``.ort`` file holds something this converter does not copy."""


def _text(value: bytes | None) -> str:
    return value.decode() if value else ""


def convert_ort_file(ort_path: Path) -> onnx.ModelProto:
    """The model of ``ort_path`` as an ONNX ``ModelProto`` (in memory)."""
    buffer = ort_path.read_bytes()
    if not InferenceSession.InferenceSessionBufferHasIdentifier(buffer, 0):
        raise OrtFormatError(f"{ort_path} is not an onnxruntime .ort model")
    try:
        return _model(InferenceSession.GetRootAs(buffer, 0).Model(), ort_path)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise OrtFormatError(f"{ort_path} is damaged or cut short ({exc})") from None


def _model(model: Fb, ort_path: Path) -> onnx.ModelProto:
    if model is None:
        raise OrtFormatError(f"{ort_path} holds no model")
    opsets = [
        helper.make_opsetid(_text(model.OpsetImport(i).Domain()), model.OpsetImport(i).Version())
        for i in range(model.OpsetImportLength())
    ]
    proto = helper.make_model(
        _graph(model.Graph(), "main"),
        opset_imports=opsets,
        producer_name="omnitrio ort_to_onnx",
    )
    proto.ir_version = model.IrVersion()
    return proto


def _graph(graph: Fb, name: str) -> onnx.GraphProto:
    if graph.SparseInitializersLength():
        raise OrtFormatError("sparse initializers are not supported")
    values = {}
    for i in range(graph.NodeArgsLength()):
        arg = graph.NodeArgs(i)
        values[_text(arg.Name())] = _value_info(arg)
    initializers = [_tensor(graph.Initializers(i)) for i in range(graph.InitializersLength())]
    initialized = {t.name for t in initializers}
    inputs = [_text(graph.Inputs(i)) for i in range(graph.InputsLength())]
    outputs = [_text(graph.Outputs(i)) for i in range(graph.OutputsLength())]
    nodes = [_node(graph.Nodes(i)) for i in range(graph.NodesLength())]
    # Keep every other value's type too (the shipped graph had them): shape inference
    # then has nothing to guess.
    listed = set(inputs) | set(outputs) | initialized
    return helper.make_graph(
        nodes,
        name,
        [values[n] for n in inputs if n not in initialized],
        [values[n] for n in outputs],
        initializer=initializers,
        value_info=[
            v for n, v in values.items() if n not in listed and v.type.HasField("tensor_type")
        ],
    )


def _node(node: Fb) -> onnx.NodeProto:
    if node.Type() != NodeType.Primitive:
        raise OrtFormatError(f"node {_text(node.Name())!r} is a fused node")
    proto = helper.make_node(
        _text(node.OpType()),
        [_text(node.Inputs(i)) for i in range(node.InputsLength())],
        [_text(node.Outputs(i)) for i in range(node.OutputsLength())],
        name=_text(node.Name()),
        domain=_text(node.Domain()),
    )
    proto.attribute.extend(_attribute(node.Attributes(i)) for i in range(node.AttributesLength()))
    return proto


def _attribute(attribute: Fb) -> onnx.AttributeProto:
    name = _text(attribute.Name())
    kind = attribute.Type()
    value: object
    if kind == AttributeType.FLOAT:
        value = attribute.F()
    elif kind == AttributeType.INT:
        value = attribute.I()
    elif kind == AttributeType.STRING:
        value = attribute.S() or b""
    elif kind == AttributeType.TENSOR:
        value = _tensor(attribute.T())
    elif kind == AttributeType.GRAPH:
        value = _graph(attribute.G(), name)
    elif kind == AttributeType.FLOATS:
        value = [attribute.Floats(i) for i in range(attribute.FloatsLength())]
    elif kind == AttributeType.INTS:
        value = [attribute.Ints(i) for i in range(attribute.IntsLength())]
    elif kind == AttributeType.STRINGS:
        value = [attribute.Strings(i) for i in range(attribute.StringsLength())]
    elif kind == AttributeType.TENSORS:
        value = [_tensor(attribute.Tensors(i)) for i in range(attribute.TensorsLength())]
    elif kind == AttributeType.GRAPHS:
        value = [_graph(attribute.Graphs(i), name) for i in range(attribute.GraphsLength())]
    else:
        raise OrtFormatError(f"attribute {name!r} has unsupported type {kind}")
    proto = helper.make_attribute(name, value)
    if kind in (AttributeType.FLOATS, AttributeType.INTS, AttributeType.STRINGS) and not value:
        proto.type = kind  # an empty list keeps its declared type
    return proto


def _tensor(tensor: Fb) -> onnx.TensorProto:
    if tensor.ExternalDataOffset() >= 0:
        raise OrtFormatError(f"tensor {_text(tensor.Name())!r} has external data")
    proto = onnx.TensorProto()
    proto.name = _text(tensor.Name())
    proto.data_type = tensor.DataType()
    proto.dims.extend(tensor.Dims(i) for i in range(tensor.DimsLength()))
    if tensor.StringDataLength():
        proto.string_data.extend(tensor.StringData(i) for i in range(tensor.StringDataLength()))
    else:
        raw = tensor.RawDataAsNumpy()
        proto.raw_data = b"" if isinstance(raw, int) else np.asarray(raw).tobytes()
    return proto


def _value_info(arg: Fb) -> onnx.ValueInfoProto:
    name = _text(arg.Name())
    type_info = arg.Type()
    if type_info is None or type_info.ValueType() != TypeInfoValue.tensor_type:
        return helper.make_value_info(name, onnx.TypeProto())
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.TensorTypeAndShape import (
        TensorTypeAndShape,
    )

    tensor_type = TensorTypeAndShape()
    table = type_info.Value()
    tensor_type.Init(table.Bytes, table.Pos)
    shape_fb = tensor_type.Shape()
    shape: list[int | str | None] | None = None
    if shape_fb is not None:
        shape = []
        for i in range(shape_fb.DimLength()):
            dim = shape_fb.Dim(i).Value()
            if dim is None or dim.DimType() == DimensionValueType.UNKNOWN:
                shape.append(None)
            elif dim.DimType() == DimensionValueType.VALUE:
                shape.append(dim.DimValue())
            else:
                shape.append(_text(dim.DimParam()))
    return helper.make_tensor_value_info(name, tensor_type.ElemType(), shape)
