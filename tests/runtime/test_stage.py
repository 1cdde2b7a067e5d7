"""What a stage class declares (``omnitrio/_stage.py``'s ``StageDeclarations``): read in one
place with its types, and a declaration of the wrong type refused where the config is
parsed, naming the stage."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

import omnitrio
from omnitrio._config import resolve_impl
from omnitrio._stage import StageDeclarations, StepLimits

REPO = Path(__file__).resolve().parents[2]


class Quiet:
    """A stage that declares nothing beyond the protocol."""

    max_inputs_per_step = None
    max_payloads_per_step = 0
    max_visible_per_step = 1

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.name = name

    def open_stream(self, stream_id: str, request: omnitrio.Request) -> None:
        pass

    def step(self, batch: Sequence[omnitrio.StreamWork]) -> Mapping[str, omnitrio.StreamOutput]:
        return {work.stream_id: omnitrio.StreamOutput(done=True) for work in batch}

    def close_stream(self, stream_id: str) -> None:
        pass

    def close(self) -> None:
        pass


class Transcriber(Quiet):
    checkpoint = "tiny-family"
    tasks = ("transcribe",)
    voices = ("alba", "bryn")


class TasksAsText(Quiet):
    tasks = "transcribe"  # a str, not a tuple of them


class NumberedCheckpoint(Quiet):
    checkpoint = 3


def test_a_stage_that_declares_nothing_has_the_defaults() -> None:
    assert StageDeclarations.of(Quiet) == StageDeclarations(None, (), ())
    assert not StepLimits.of_stage(Quiet("q")).ends_without_input


def test_a_loaded_stage_may_say_it_ends_streams_that_bring_nothing() -> None:
    stage = Quiet("q")
    stage.ends_without_input = True  # type: ignore[attr-defined]
    assert StepLimits.of_stage(stage).ends_without_input
    stage.ends_without_input = "yes"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="ends_without_input must be a bool"):
        StepLimits.of_stage(stage)


def test_declarations_are_read_with_their_types() -> None:
    assert StageDeclarations.of(Transcriber) == StageDeclarations(
        "tiny-family", ("transcribe",), ("alba", "bryn")
    )


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (
            "TasksAsText",
            "TasksAsText.tasks must be a tuple of str, not 'transcribe'; fix the stage",
        ),
        ("NumberedCheckpoint", "NumberedCheckpoint.checkpoint must be a str, not 3; fix the stage"),
    ],
)
def test_a_declaration_of_the_wrong_type_is_refused_at_parse(stage: str, message: str) -> None:
    config = {
        "pipeline": {"name": "t"},
        "stages": [{"name": "s", "impl": f"tests.runtime.test_stage:{stage}"}],
    }
    with pytest.raises(omnitrio.ConfigError) as caught:
        omnitrio.parse_config(config)
    assert str(caught.value) == f"<in-code config>: stages[0].impl: {message}"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_a_shipped_stage_that_reads_a_checkpoint_names_its_own_family(name: str) -> None:
    # checkpoint is the family's name (stages/<family>/__init__.py's FAMILY), the one
    # --model-path DIR and make-tiny-model --family use.
    config = omnitrio.load_config(REPO / "configs" / name)
    for spec in config.stages:
        declared = StageDeclarations.of(resolve_impl(spec.impl, config.source, "impl"))
        if declared.checkpoint is not None:
            family = importlib.import_module(spec.impl.partition(":")[0].rpartition(".")[0])
            assert declared.checkpoint == family.FAMILY
