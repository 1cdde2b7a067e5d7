"""moonshine_steps.py refuses a model that is not a merged Moonshine decoder (the
split of the real one is checked bit for bit in test_voice_moonshine.py)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from stages.voice.moonshine_steps import NotMergedDecoder, split_decoder


def _value(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])


def _if_model(then_nodes: list[onnx.NodeProto], inputs: list[str]) -> onnx.ModelProto:
    """An If on ``flag`` whose branches both make ``logits`` (``then_nodes`` the then
    branch's, an Identity of ``x`` the else branch's)."""
    then_branch = helper.make_graph(then_nodes, "then", [], [_value("logits")])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["logits"])], "else", [], [_value("logits")]
    )
    node = helper.make_node(
        "If", ["flag"], ["logits"], then_branch=then_branch, else_branch=else_branch
    )
    graph_inputs = [helper.make_tensor_value_info("flag", TensorProto.BOOL, [1])]
    graph_inputs += [_value(name) for name in inputs]
    graph = helper.make_graph([node], "merged", graph_inputs, [_value("logits")])
    return helper.make_model(graph)


def test_a_graph_that_is_not_one_if_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["logits"])], "g", [_value("x")], [_value("logits")]
    )
    with pytest.raises(NotMergedDecoder, match="not a single If node"):
        split_decoder(helper.make_model(graph))


def test_an_if_without_a_cross_attention_cache_is_refused() -> None:
    model = _if_model([helper.make_node("Identity", ["x"], ["logits"])], ["x"])
    with pytest.raises(NotMergedDecoder, match=r"no past_key_values\.\*\.encoder\.key"):
        split_decoder(model)


def test_a_cache_without_moonshines_scaled_keys_is_refused() -> None:
    # The inputs of a merged decoder, but no encoder_attn/Mul_1 node in its branches.
    model = _if_model(
        [helper.make_node("Add", ["x", "past_key_values.0.encoder.key"], ["logits"])],
        ["x", "past_key_values.0.encoder.key"],
    )
    before = model.SerializeToString()
    with pytest.raises(NotMergedDecoder, match=r"no single /model/decoder/layers\.0/encoder_attn"):
        split_decoder(model)
    assert model.SerializeToString() == before  # not changed
