"""Moonshine's merged decoder split into its two branches: a first-step model and a
next-step model, each a plain graph (no ``If``), with the greedy token chosen inside.

Why: the merged decoder (``decoder_model_merged``) is one ``If`` on
``use_cache_branch``: its else branch is the first step (it also projects the
encoder's output into each layer's cross-attention keys and values), its then branch
every later step (those keys and values come back in as ``past_key_values.*.encoder.*``).
Run as is, every step pays for the ``If`` (its sub-graph's execution frame, the
outputs copied out of it), hands back the 32768 logits to take their ``argmax`` in
numpy, copies each cache tensor out to numpy and back in again, and transposes and
scales each layer's cross-attention keys again, though they are the same at every
step. Split:

- ``first``: the else branch. Inputs ``input_ids`` and ``encoder_hidden_states``;
  outputs ``token`` (``ArgMax`` of the logits over the vocabulary, ``[1, 1]`` int64:
  the next step's ``input_ids`` as it is), ``logits``, ``present.*.decoder.*``,
  ``present.*.encoder.value`` and ``scaled_key.<layer>``: the layer's cross-attention
  keys as its attention product takes them (transposed and multiplied by the scale:
  the branch's own ``encoder_attn/Mul_1`` output).
- ``next``: the then branch. Inputs ``input_ids``, ``past_key_values.*.decoder.*``,
  ``past_key_values.*.encoder.value`` and ``scaled_key.<layer>`` (in place of the
  ``Transpose`` and ``Mul`` it ran on ``past_key_values.*.encoder.key`` every step);
  outputs ``token``, ``logits`` and ``present.*.decoder.*``.

Nothing is computed differently: the same nodes on the same values, and a transpose
is a copy, so both give bit for bit the logits and tokens of the merged decoder
(tests/stages/voice/test_voice_moonshine.py). ``moonshine.py`` runs them with
onnxruntime's I/O binding: each step's outputs (the token, the cache) are bound as
the next step's inputs as they are, without a copy through numpy.
"""

from __future__ import annotations

import re

import onnx
from onnx import TensorProto, helper

TOKEN = "token"
LOGITS = "logits"
SCALED_KEY = "scaled_key.{layer}"
_PAST_KEY = re.compile(r"past_key_values\.(\d+)\.encoder\.key")


class NotMergedDecoder(ValueError):
    """The model is not a merged Moonshine decoder this module knows how to split."""


def split_decoder(merged: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The first-step and next-step models of a merged decoder (see the module
    docstring); ``merged`` is not changed."""
    graph = merged.graph
    if len(graph.node) != 1 or graph.node[0].op_type != "If":
        raise NotMergedDecoder("the decoder's graph is not a single If node")
    branch = {a.name: a.g for a in graph.node[0].attribute}
    outputs = list(graph.node[0].output)
    for name in ("then_branch", "else_branch"):
        if [o.name for o in branch[name].output] != outputs:
            raise NotMergedDecoder(f"the If's {name} outputs differ from the If's")
    layers = sorted(
        int(m.group(1)) for i in graph.input if (m := _PAST_KEY.fullmatch(i.name)) is not None
    )
    if not layers or LOGITS not in outputs:
        raise NotMergedDecoder("no past_key_values.*.encoder.key inputs or no logits output")
    first = _first(merged, branch["else_branch"], layers)
    later = _next(merged, branch["then_branch"], layers)
    return first, later


def _scaled_key_node(graph: onnx.GraphProto, layer: int) -> onnx.NodeProto:
    """The layer's ``encoder_attn/Mul_1``: its cross-attention keys, transposed for the
    product with the queries and multiplied by the scale."""
    name = f"/model/decoder/layers.{layer}/encoder_attn/Mul_1"
    found = [n for n in graph.node if n.name == name and n.op_type == "Mul"]
    if len(found) != 1:
        raise NotMergedDecoder(f"no single {name} in the branch {graph.name}")
    return found[0]


def _first(merged: onnx.ModelProto, branch: onnx.GraphProto, layers: list[int]) -> onnx.ModelProto:
    nodes = list(branch.node)
    extra = []
    for layer in layers:
        mul = _scaled_key_node(branch, layer)
        producer = {o: n for n in nodes for o in n.output}[mul.input[0]]
        if producer.op_type != "Transpose" or _perm(producer) != [0, 2, 3, 1]:
            raise NotMergedDecoder(f"layer {layer}: the first step's keys are not transposed")
        name = SCALED_KEY.format(layer=layer)
        nodes.append(helper.make_node("Identity", [mul.output[0]], [name], name=f"/{name}"))
        extra.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    nodes.append(_argmax())
    wanted = [o for o in branch.output if not _is_encoder_key(o.name)]
    token = helper.make_tensor_value_info(TOKEN, TensorProto.INT64, [1, 1])
    return _model(merged, branch, nodes, [token, *wanted, *extra], "first")


def _next(merged: onnx.ModelProto, branch: onnx.GraphProto, layers: list[int]) -> onnx.ModelProto:
    nodes = list(branch.node)
    renamed: dict[str, str] = {}
    dropped: set[str] = set()
    for layer in layers:
        mul = _scaled_key_node(branch, layer)
        producer = {o: n for n in nodes for o in n.output}[mul.input[0]]
        if (
            producer.op_type != "Transpose"
            or list(producer.input) != [f"past_key_values.{layer}.encoder.key"]
            or _perm(producer) != [0, 1, 3, 2]
        ):
            raise NotMergedDecoder(f"layer {layer}: the next steps' keys are not transposed")
        renamed[mul.output[0]] = SCALED_KEY.format(layer=layer)
        dropped.add(mul.name)
    kept = []
    for node in nodes:
        if node.name in dropped:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for number, name in enumerate(copy.input):
            if name in renamed:
                copy.input[number] = renamed[name]
        kept.append(copy)
    kept.append(_argmax())
    wanted = [o for o in branch.output if ".encoder." not in o.name]
    token = helper.make_tensor_value_info(TOKEN, TensorProto.INT64, [1, 1])
    keys = {i.name: i for i in merged.graph.input}
    extra_inputs = []
    for layer in layers:
        key = onnx.ValueInfoProto()
        key.CopyFrom(keys[f"past_key_values.{layer}.encoder.key"])
        key.name = SCALED_KEY.format(layer=layer)
        dims = key.type.tensor_type.shape.dim
        dims[2].CopyFrom(keys[f"past_key_values.{layer}.encoder.key"].type.tensor_type.shape.dim[3])
        dims[3].CopyFrom(keys[f"past_key_values.{layer}.encoder.key"].type.tensor_type.shape.dim[2])
        extra_inputs.append(key)
    return _model(merged, branch, kept, [token, *wanted], "next", extra_inputs)


def _is_encoder_key(name: str) -> bool:
    return name.startswith("present.") and name.endswith(".encoder.key")


def _one_utterance_one_token(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """A copy of ``value`` with its batch and decoder sequence axes set to 1 (one
    utterance, one token per step, as moonshine.py runs them): onnxruntime then folds
    the shape arithmetic on them at load (~940 -> ~680 nodes a step); what is left
    depends only on the cache's length and the utterance's."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    for dim in copy.type.tensor_type.shape.dim:
        if dim.dim_param in ("batch_size", "decoder_sequence_length"):
            dim.ClearField("dim_param")
            dim.dim_value = 1
    return copy


def _perm(node: onnx.NodeProto) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), [])


def _argmax() -> onnx.NodeProto:
    """The greedy token: the first index of the largest logit (what numpy's argmax
    takes), over the vocabulary of the one position: ``[1, 1]``."""
    return helper.make_node("ArgMax", [LOGITS], [TOKEN], name="/greedy/ArgMax", axis=-1, keepdims=0)


def _model(
    merged: onnx.ModelProto,
    branch: onnx.GraphProto,
    nodes: list[onnx.NodeProto],
    outputs: list[onnx.ValueInfoProto],
    which: str,
    extra_inputs: list[onnx.ValueInfoProto] | None = None,
) -> onnx.ModelProto:
    """A standalone model of ``nodes``: only the nodes the outputs need, the outer
    graph's inputs and initializers they read, the branch's own initializers."""
    needed = {o.name for o in outputs}
    live: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed |= {i for i in node.input if i}
    live.reverse()
    outer = merged.graph
    inputs = [i for i in outer.input if i.name in needed] + [
        i for i in extra_inputs or [] if i.name in needed
    ]
    initializers = [i for i in outer.initializer if i.name in needed] + [
        i for i in branch.initializer if i.name in needed
    ]
    inputs, outputs = (
        [_one_utterance_one_token(v) for v in inputs],
        [_one_utterance_one_token(v) for v in outputs],
    )
    graph = helper.make_graph(
        live,
        f"{outer.name}-{which}",
        inputs,
        outputs,
        initializers,
        value_info=[v for v in branch.value_info if v.name in needed],
    )
    return helper.make_model(
        graph, opset_imports=list(merged.opset_import), ir_version=merged.ir_version
    )
