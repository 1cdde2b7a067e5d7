"""Every stage in stages/ declares its per-step limits, so a config whose capacities
cannot hold one step is refused where it is parsed, naming the stage, before any
model loads: these tests only parse (the model folders named do not exist)."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

import omnitrio

REPO = Path(__file__).resolve().parents[2]
MISSING = "no-such-model-folder"  # parsing never opens it


def _shipped(name: str) -> dict[str, Any]:
    data = yaml.safe_load((REPO / "configs" / name).read_text())
    assert isinstance(data, dict)
    return data


def _stage(data: dict[str, Any], name: str) -> dict[str, Any]:
    found = [s for s in (*data["stages"], data.get("side_stage")) if s and s["name"] == name]
    assert len(found) == 1
    stage: dict[str, Any] = found[0]
    return stage


def _refusal(data: dict[str, Any]) -> omnitrio.ConfigError:
    with pytest.raises(omnitrio.ConfigError) as caught:
        omnitrio.parse_config(data, source="test.yaml")
    return caught.value


def _voice_chat() -> dict[str, Any]:
    return copy.deepcopy(_shipped("voice-chat.yaml"))


def _qwen2_5() -> dict[str, Any]:
    data = copy.deepcopy(_shipped("qwen2.5-omni-tiny.yaml"))
    for stage in data["stages"]:
        stage["params"]["model_path"] = MISSING
    return data


def test_the_shipped_shapes_parse_as_they_are() -> None:
    omnitrio.parse_config(_voice_chat())
    omnitrio.parse_config(_qwen2_5())


@pytest.mark.parametrize(
    ("client_capacity", "stage", "limit"),
    [(2, "llm", 3), (7, "vad", 8)],
)
def test_voice_chat_client_capacity_below_a_stage_step(
    client_capacity: int, stage: str, limit: int
) -> None:
    data = _voice_chat()
    data["pipeline"]["client_capacity"] = client_capacity
    error = _refusal(data)
    assert error.key == "pipeline.client_capacity"
    assert f"below stage {stage!r} max_visible_per_step={limit}; raise it" in str(error)


def test_voice_chat_vad_events_per_step_follow_its_params() -> None:
    data = _voice_chat()
    _stage(data, "vad")["params"]["max_events_per_step"] = 17
    error = _refusal(data)
    assert error.key == "pipeline.client_capacity"
    assert "below stage 'vad' max_visible_per_step=17" in str(error)
    _stage(data, "vad")["params"]["max_events_per_step"] = 0
    error = _refusal(data)
    assert error.key == "side_stage.params"
    assert "max_events_per_step must be a positive integer, got 0" in str(error)


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO / "configs").glob("*.yaml") if "ray" not in p.name)
)
def test_every_shipped_stage_class_declares_its_limits(name: str) -> None:
    # As ``Stage``'s docstring says: a ``step_limits`` classmethod or int class
    # attributes (what parse_config reads), for every stage of every shipped config.
    data = _shipped(name)
    for spec in (*data["stages"], data.get("side_stage")):
        if spec is None:
            continue
        module, _, attr = spec["impl"].partition(":")
        factory = getattr(importlib.import_module(module), attr)
        declared = callable(getattr(factory, "step_limits", None)) or (
            type(getattr(factory, "max_payloads_per_step", None)) is int
            and type(getattr(factory, "max_visible_per_step", None)) is int
        )
        assert declared, f"{spec['impl']} declares no per-step limits on its class"


def test_qwen2_5_edge_below_the_thinkers_payloads() -> None:
    data = _qwen2_5()
    data["edges"][0]["capacity"] = 3
    error = _refusal(data)
    assert error.key == "edges[from=thinker].capacity"
    assert "3 is below stage 'thinker' max_payloads_per_step=4" in str(error)
    data = _qwen2_5()
    data["edges"][1]["capacity"] = 2
    error = _refusal(data)
    assert error.key == "edges[from=talker].capacity"
    assert "below stage 'talker' max_payloads_per_step=4" in str(error)


@pytest.mark.parametrize(
    ("stage", "params", "limit"),
    [
        ("thinker", {"emit_ids": True}, 2),
        ("token2wav", {"max_windows_per_step": 3}, 3),
    ],
)
def test_qwen2_5_visible_limits_follow_the_params(
    stage: str, params: dict[str, Any], limit: int
) -> None:
    data = _qwen2_5()
    data["pipeline"]["client_capacity"] = limit - 1
    _stage(data, stage)["params"].update(params)
    error = _refusal(data)
    assert error.key == "pipeline.client_capacity"
    assert f"below stage {stage!r} max_visible_per_step={limit}; raise it" in str(error)


@pytest.mark.parametrize(
    ("stage", "params", "problem"),
    [
        ("thinker", {"emit_ids": "yes"}, "emit_ids must be true or false, got 'yes'"),
        ("talker", {"emit_codes": 1}, "emit_codes must be true or false, got 1"),
        ("token2wav", {"max_windows_per_step": 0}, "must be a positive integer, got 0"),
    ],
)
def test_qwen2_5_bad_limit_params_name_the_stage(
    stage: str, params: dict[str, Any], problem: str
) -> None:
    data = _qwen2_5()
    _stage(data, stage)["params"].update(params)
    index = [s["name"] for s in data["stages"]].index(stage)
    error = _refusal(data)
    assert error.key == f"stages[{index}].params"
    assert problem in str(error)


def test_the_fault_injector_reads_the_limits_of_the_stage_it_wraps() -> None:
    data = _qwen2_5()
    thinker = data["stages"][0]
    data["stages"][0] = {
        "name": "thinker",
        "impl": "stages.faults:FaultInjector",
        "params": {"impl": thinker["impl"], "params": {**thinker["params"], "emit_ids": True}},
    }
    data["pipeline"]["client_capacity"] = 1
    error = _refusal(data)
    assert "below stage 'thinker' max_visible_per_step=2" in str(error)
