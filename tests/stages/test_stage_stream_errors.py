"""Error isolation in the stage kit (issue 27 #2): one stream of the voice chat's LLM
batch whose grammar cannot continue fails alone; the streams decoded in the same
batch finish with exactly the answer they get alone. Real SmolLM2 (float32, so the
batch never changes a greedy answer), real llguidance grammar."""

from __future__ import annotations

import json

import pytest
import trio

import omnitrio
from omnitrio import Request, StageError, TextDelta
from stages.kit import GrammarError
from tests.voice_support import needs_voice

pytestmark = [needs_voice, pytest.mark.usefixtures("voice_weights")]

# Passes the grammar's own validation (it compiles lazily) but cannot be decoded: a
# required child of its own type, forever. The server refuses it up front (a $ref
# cycle); here it reaches the stage directly, as a stage bug or a new schema feature could.
RECURSIVE_TOOL = {
    "name": "tree",
    "description": "",
    "parameters": {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
}


def _config() -> omnitrio.PipelineConfig:
    return omnitrio.parse_config(
        {
            "pipeline": {"name": "llm", "max_streams": 8, "client_capacity": 64},
            "stages": [
                {
                    "name": "llm",
                    "impl": "stages.voice.llm:SmolLM2Llm",
                    "max_batch_size": 8,
                    "params": {"dtype": "float32", "max_new_tokens": 12},
                },
                # The LLM hands its text on to a speaker; a synthetic sink takes it here.
                {
                    "name": "sink",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"outputs_per_input": 0},
                },
            ],
            "edges": [{"from": "llm", "to": "sink"}],
        }
    )


NORMAL = [Request(text=f"user: Say a word about the number {i}.") for i in range(3)]
HOSTILE = Request(
    text="user: grow a tree",
    options={"tools": json.dumps([RECURSIVE_TOOL]), "tool_choice": "required"},
)


async def _answer(pipeline: omnitrio.Pipeline, request: Request) -> str | Exception:
    try:
        async with pipeline.open_stream(request) as stream:
            return "".join([i.text async for i in stream if isinstance(i, TextDelta)])
    except StageError as exc:
        return exc


async def test_a_grammar_error_fails_only_its_stream_of_the_batch() -> None:
    async with omnitrio.open_pipeline(_config()) as pipeline:
        alone = [await _answer(pipeline, r) for r in NORMAL]
        results: dict[int, str | Exception] = {}

        async def run(index: int, request: Request) -> None:
            results[index] = await _answer(pipeline, request)

        async with trio.open_nursery() as nursery:
            for index, request in enumerate([*NORMAL, HOSTILE]):
                nursery.start_soon(run, index, request)
        stats = pipeline.statistics().stages["llm"]
    failed = results[len(NORMAL)]
    assert isinstance(failed, StageError)
    assert isinstance(failed.__cause__, GrammarError)
    assert [results[i] for i in range(len(NORMAL))] == alone  # exact, batched beside it
    assert all(isinstance(a, str) and a for a in alone)
    assert stats.largest_batch_size >= 2  # the hostile stream was decoded in a batch
    assert stats.num_step_failures == 0  # no step failed: one stream did
    assert stats.num_stream_failures == 1
