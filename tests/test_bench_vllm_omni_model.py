"""The vllm-omni model's moving parts: its shared-memory connector and its stage processes.

End to end (every request completes with every token and chunk) it runs in
``test_bench_smoke.py``; timing is the benchmark's business, not asserted here.
"""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("zmq", reason="pyzmq is in the optional bench extra")

import omnitrio
from omnitrio.bench._target import TargetError
from omnitrio.bench._vllm_omni_model import _Connector, _shm_path, open_vllm_omni_model
from omnitrio.bench._vllm_omni_settings import ModelSettings


def wait_for(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("save_limit", [None, 512])
def test_chunks_travel_in_order_through_shared_memory_and_are_unlinked(
    save_limit: int | None,
) -> None:
    settings = ModelSettings(save_limit=save_limit)
    sender = _Connector("t1", 0, settings, sends=True)
    receiver = _Connector("t1", 1, settings, sends=False)
    try:
        receiver.load_async("s")
        keys = [sender.key("s", k, 0) for k in range(3)]
        for k, key in enumerate(keys):
            sender.save_async(key, {"payloads": [f"p{k}a", f"p{k}b"], "done": k == 2})
        wait_for(lambda: "s" in receiver.upstream_done)
        assert list(receiver.inbox["s"]) == ["p0a", "p0b", "p1a", "p1b", "p2a", "p2b"]
        assert not any(os.path.exists(_shm_path(key)) for key in keys)  # the reader unlinks
    finally:
        sender.stop()
        receiver.stop()


def test_a_chunk_nobody_took_is_unlinked_when_the_sender_stops() -> None:
    sender = _Connector("t2", 0, ModelSettings(), sends=True)
    key = sender.key("gone", 0, 0)
    try:
        sender.save_async(key, {"payloads": ["x"], "done": True})
        wait_for(lambda: os.path.exists(_shm_path(key)))
    finally:
        sender.stop()
    assert not os.path.exists(_shm_path(key))


async def test_a_stage_that_cannot_load_is_a_clear_error() -> None:
    config = omnitrio.parse_config(
        {
            "pipeline": {"name": "broken"},
            "stages": [
                {
                    "name": "thinker",
                    "impl": "stages.synthetic:SyntheticStage",
                    "params": {"steps": 2, "inputs_per_step": 0},
                }
            ],
        }
    )
    with pytest.raises(TargetError, match="stage process 0 could not load its stage: ValueError"):
        async with open_vllm_omni_model(config, ModelSettings(), "vllm-omni-model"):
            pass
