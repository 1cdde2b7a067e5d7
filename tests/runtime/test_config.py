"""Config loading: valid files load; every invalid one names the file, the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

import omnitrio

REPO = Path(__file__).resolve().parents[2]

GOOD = """
pipeline: {name: t}
stages:
  - {name: b, impl: "stages.synthetic:SyntheticStage", params: {outputs_per_input: 0}}
  - {name: a, impl: "stages.synthetic:SyntheticStage", params: {steps: 3}}
edges:
  - {from: a, to: b, capacity: 2}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_load(name: str) -> None:
    config = omnitrio.load_config(REPO / "configs" / name)
    assert config.stages


def test_defaults_and_chain_order(tmp_path: Path) -> None:
    config = omnitrio.load_config(_write(tmp_path, GOOD))
    assert [s.name for s in config.stages] == ["a", "b"]  # ordered along the edges
    assert config.pipeline.max_streams == 64
    assert config.pipeline.client_capacity == omnitrio.DEFAULT_CLIENT_CAPACITY == 16
    assert config.edges[0].capacity == 2
    assert config.stages[0].max_batch_size == 32


def test_default_edge_capacity(tmp_path: Path) -> None:
    config = omnitrio.load_config(_write(tmp_path, GOOD.replace(", capacity: 2", "")))
    assert config.edges[0].capacity == omnitrio.DEFAULT_EDGE_CAPACITY == 8


BAD = [
    (
        GOOD.replace("pipeline: {name: t}", "pipeline: {name: t, max_stream: 3}"),
        "pipeline.max_stream: unknown key; remove it or fix its spelling",
    ),
    (
        GOOD.replace("pipeline: {name: t}", "pipeline: {}"),
        "pipeline.name: required key is missing; add it",
    ),
    (
        GOOD.replace("capacity: 2", "capacity: 0"),
        "edges[0].capacity: input should be greater than or equal to 1; fix the value",
    ),
    (
        GOOD.replace("{from: a, to: b", "{from: a, to: x"),
        "edges[0].to: no stage named 'x'; stages are b, a",
    ),
    (GOOD.replace("name: a,", "name: b,"), "stages[1].name: duplicate stage name 'b'; rename it"),
    (
        GOOD.replace("  - {from: a, to: b, capacity: 2}\n", ""),
        "edges: stage 'a' is not on the chain from the first stage; add an edge {from: b, to: a}",
    ),
    (
        GOOD + "  - {from: b, to: a}\n",
        "edges: the edges form a cycle; remove the edge into the first stage",
    ),
    (
        GOOD.replace(
            'stages.synthetic:SyntheticStage", params: {steps',
            'stages.nowhere:SyntheticStage", params: {steps',
        ),
        "stages[1].impl: cannot import 'stages.nowhere'",
    ),
    (
        GOOD.replace(
            'stages.synthetic:SyntheticStage", params: {steps',
            'stages.synthetic:Nope", params: {steps',
        ),
        "stages[1].impl: module 'stages.synthetic' has no 'Nope'; fix the name after the colon",
    ),
    (
        GOOD.replace("{steps: 3}", "{step: 3}"),
        "stages[1].params.step: stages.synthetic:SyntheticStage has no parameter 'step'; "
        "known parameters: steps,",
    ),
    (
        GOOD.replace("{steps: 3}", "{steps: 3, device: cuda}"),
        "stages[1].params.device: 'device' is set by the stage entry itself; move it out of params",
    ),
    (
        GOOD.replace("impl:", "implementation:", 1),
        "stages[0].impl: required key is missing; add it",
    ),
    (
        GOOD + "  - {from: a, to: c}\n",
        "edges[1].to: no stage named 'c'; stages are b, a",
    ),
    (
        GOOD.replace(
            "  - {from: a, to: b, capacity: 2}\n", "  - {from: a, to: b}\n  - {from: a, to: a}\n"
        ),
        "edges[1].from: stage 'a' already has an outgoing edge; pipelines are chains, "
        "so give each stage at most one",
    ),
    (
        GOOD.replace("pipeline: {name: t}", "pipeline: {name: t, shutdown_timeout_s: .inf}"),
        "pipeline.shutdown_timeout_s: should be a finite number; fix the value",
    ),
    (
        GOOD.replace("name: a,", "name: a, step_timeout_s: .inf,"),
        "stages[1].step_timeout_s: should be a finite number; fix the value",
    ),
    (
        GOOD.replace("name: a,", "name: a, placement: gpu,"),
        "stages[1].placement: input should be 'thread' or 'ray'; fix the value",
    ),
    (
        GOOD.replace("name: a,", "name: a, resources: {num_gpus: 1},"),
        "stages[1].resources: resources apply to placement: ray only; "
        "set placement: ray or remove them",
    ),
    (
        GOOD.replace("name: a,", "name: a, placement: ray, resources: {num_gpus: -1},"),
        "stages[1].resources.num_gpus: input should be greater than or equal to 0",
    ),
    (
        GOOD.replace("name: a,", "name: a, placement: ray, resources: {gpus: 1},"),
        "stages[1].resources.gpus: unknown key; remove it or fix its spelling",
    ),
    (
        GOOD.replace("name: a,", "name: a, placement: ray, resources: {custom: {node_b: x}},"),
        "stages[1].resources.custom.node_b: input should be a valid number",
    ),
    (
        GOOD.replace("pipeline: {name: t}", "pipeline: {name: t, ray_address: ''}"),
        "pipeline.ray_address: string should have at least 1 character",
    ),
    ("pipeline: [\n", "line 2: not valid YAML"),
    ("- just\n- a list\n", "<top>: a config must be a mapping with pipeline, stages, edges"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_invalid_configs_name_file_key_and_fix(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(omnitrio.ConfigError) as caught:
        omnitrio.load_config(path)
    assert str(caught.value).startswith(f"{path}: {message}")


FOUR_PROBLEMS = """
pipeline: {name: t, max_stream: 3}
stages:
  - {name: b, impl: "stages.synthetic:SyntheticStage", params: {outputs_per_input: 0}}
  - {name: a, impl: "stages.synthetic:SyntheticStage", params: {step: 3, tones: 1}}
  - {name: c, impl: "stages.nowhere:Stage"}
edges:
  - {from: a, to: b, capacity: 0}
"""


def test_every_problem_in_a_file_is_reported_at_once(tmp_path: Path) -> None:
    # Four mistakes of four kinds (an unknown key, a bad capacity, unknown params, an
    # impl that does not import): one load names them all, each on its own line.
    path = _write(tmp_path, FOUR_PROBLEMS)
    with pytest.raises(omnitrio.ConfigError) as caught:
        omnitrio.load_config(path)
    error = caught.value
    found = [(e.key, e.problem.split(";")[0]) for e in (error, *error.also)]
    assert found == [
        ("pipeline.max_stream", "unknown key"),
        ("edges[0].capacity", "input should be greater than or equal to 1"),
        ("stages[1].params.step", "stages.synthetic:SyntheticStage has no parameter 'step'"),
        ("stages[1].params.tones", "stages.synthetic:SyntheticStage has no parameter 'tones'"),
        ("stages[2].impl", "cannot import 'stages.nowhere' (No module named 'stages.nowhere')"),
    ]
    lines = str(error).splitlines()
    assert len(lines) == 5
    assert all(line.startswith(f"{path}: ") for line in lines)
    # The same problems once the structure is right: the graph's and the stages' together.
    fixed = FOUR_PROBLEMS.replace(", max_stream: 3", "").replace("capacity: 0", "capacity: 2")
    with pytest.raises(omnitrio.ConfigError) as caught:
        omnitrio.load_config(_write(tmp_path, fixed))
    keys = [e.key for e in (caught.value, *caught.value.also)]
    assert keys == ["edges", "stages[1].params.step", "stages[1].params.tones", "stages[2].impl"]


def test_a_config_error_with_all_its_problems_pickles() -> None:
    import pickle

    error = omnitrio.ConfigError.of_all(
        [
            omnitrio.ConfigError("f.yaml", "a", "one; fix"),
            omnitrio.ConfigError("f.yaml", "b", "two"),
        ]
    )
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) == "f.yaml: a: one; fix\nf.yaml: b: two"
    assert [e.key for e in copy.also] == ["b"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(omnitrio.ConfigError, match="<file>: cannot read it"):
        omnitrio.load_config(tmp_path / "nope.yaml")


def test_a_nul_byte_in_the_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(
        omnitrio.ConfigError, match=r"<file>: cannot read it \(a NUL byte in the path\)"
    ):
        omnitrio.load_config(f"{tmp_path}/pipe\x00line.yaml")


def test_required_stage_parameter(tmp_path: Path) -> None:
    text = GOOD.replace(
        '"stages.synthetic:SyntheticStage", params: {steps: 3}',
        '"tests.runtime.test_config:NeedsModel", params: {}',
    )
    with pytest.raises(omnitrio.ConfigError, match=r"stages\[1\].params.model_path: .* requires"):
        omnitrio.load_config(_write(tmp_path, text))


class NeedsModel:
    def __init__(self, name: str, device: str, model_path: str) -> None:
        self.model_path = model_path


def test_placement_defaults_to_a_thread_and_ray_settings_load(tmp_path: Path) -> None:
    config = omnitrio.load_config(_write(tmp_path, GOOD))
    assert all(s.placement == "thread" and s.resources is None for s in config.stages)
    assert config.pipeline.ray_address is None
    ray = omnitrio.load_config(REPO / "configs" / "synthetic-ray.yaml")
    assert all(s.placement == "ray" for s in ray.stages)
    placed = GOOD.replace(
        "name: a,", "name: a, placement: ray, resources: {num_cpus: 1, custom: {node_b: 1}},"
    ).replace("pipeline: {name: t}", "pipeline: {name: t, ray_address: '10.0.0.1:6379'}")
    config = omnitrio.load_config(_write(tmp_path, placed))
    resources = config.stages[0].resources
    assert resources is not None
    assert (resources.num_cpus, resources.num_gpus, dict(resources.custom)) == (1, 0, {"node_b": 1})
    assert config.pipeline.ray_address == "10.0.0.1:6379"
