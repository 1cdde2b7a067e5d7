"""The vllm-omni model's moving parts: its shared-memory connector and its stage processes.

End to end (every request completes with every token and chunk) it runs in
``test_bench_smoke.py``; timing is the benchmark's business, not asserted here.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import time
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
import torch
import trio

pytest.importorskip("zmq", reason="pyzmq is in the optional bench extra")

import omnitrio
from benchmarks.baselines._vllm_omni_model import (
    _Connector,
    _Engine,
    _shm_path,
    open_vllm_omni_model,
    replica_config,
)
from benchmarks.baselines._vllm_omni_outputs import RequestState, StageOutput, chat_chunk_json
from benchmarks.baselines._vllm_omni_sched import RUNNING, WAITING_FOR_CHUNK, ChunkQueues
from benchmarks.baselines._vllm_omni_settings import ModelSettings, variant
from benchmarks.harness._stages import load_stage
from benchmarks.harness._target import TargetError
from omnitrio import AudioChunk, Request, TextDelta

REPO = Path(__file__).resolve().parents[3]


def wait_for(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("save_limit", [None, 512])
def test_chunks_travel_in_order_through_shared_memory_and_are_unlinked(
    save_limit: int | None,
) -> None:
    settings = ModelSettings(save_limit=save_limit, chunk_per_schedule=False)
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


def test_the_receiver_loads_one_chunk_per_registration() -> None:
    """``_poll_single_request``: a request's next key is polled again only after its
    scheduler found it without a chunk (``rearm``, vllm-omni's ``load_async``)."""
    sender = _Connector("t6", 0, ModelSettings(), sends=True)
    receiver = _Connector("t6", 1, ModelSettings(), sends=False)
    try:
        receiver.load_async("s")
        for k in range(3):
            sender.save_async(sender.key("s", k, 0), {"payloads": [f"p{k}"], "done": k == 2})
        wait_for(lambda: list(receiver.inbox["s"]) == ["p0"])
        wait_for(lambda: os.path.exists(_shm_path(sender.key("s", 2, 0))))
        assert list(receiver.inbox["s"]) == ["p0"]  # chunks 1 and 2 wait in shared memory
        for k in (1, 2):
            receiver.inbox["s"].clear()  # the engine took the chunk
            receiver.rearm("s")
            wait_for(lambda k=k: list(receiver.inbox["s"]) == [f"p{k}"])
        assert "s" in receiver.upstream_done
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


def test_the_output_processor_copies_the_cumulative_ids_and_concatenates_at_the_end() -> None:
    state = RequestState("r1", "hi", {}, num_stages=2)
    row = torch.ones((1, 4), dtype=torch.bfloat16)
    first = state.process(0, StageOutput("r1", "a ", None, 0, False, None, {"24": row}))
    second = state.process(0, StageOutput("r1", "b ", None, 0, True, None, {"24": row}))
    (one,), (two,) = first.output.outputs, second.output.outputs
    assert (one.cumulative_token_ids, two.cumulative_token_ids) == ([0], [0, 1])
    assert one.cumulative_token_ids is not state.token_ids  # a copy per step
    # Finished at stage 0: its rows are concatenated (_consolidate_multimodal_tensors).
    (joined,) = two.multimodal_output["24"]
    assert joined.shape == (2, 4)
    assert joined.dtype == torch.bfloat16
    assert not second.done_all
    last = state.process(1, StageOutput("r1", None, b"\0\0" * 8, 24000, True, None, {}))
    assert last.done_all
    assert [type(item).__name__ for item in last.items] == ["AudioChunk"]


def test_the_api_server_writes_a_chat_chunk_per_token_and_a_base64_wav_per_audio_chunk() -> None:
    text = json.loads(chat_chunk_json("r1", TextDelta("hello"))[len("data: ") :])
    assert text["choices"][0]["delta"] == {"content": "hello"}
    pcm = numpy.arange(480, dtype="<i2").tobytes()
    audio = json.loads(chat_chunk_json("r1", AudioChunk(pcm, 24000))[len("data: ") :])
    wav = base64.b64decode(audio["choices"][0]["delta"]["audio"]["data"])
    assert wav[:4] == b"RIFF"
    assert wav.endswith(pcm)


def test_the_variants_share_one_model_and_differ_in_settings() -> None:
    seeds, today = variant("vllm-omni-model"), variant("vllm-omni-model-today")
    assert seeds.hidden_states_to_orchestrator
    assert not seeds.async_output
    assert not seeds.event_driven
    assert not today.hidden_states_to_orchestrator
    assert today.async_output
    assert today.event_driven
    assert variant("vllm-omni-model-sem512").save_limit == 512
    with pytest.raises(ValueError, match="no vllm-omni model variant"):
        variant("vllm-omni-model-tomorrow")


def test_a_stage_with_replicas_is_a_process_per_replica_of_its_share_of_the_batch() -> None:
    config = omnitrio.load_config(REPO / "configs" / "bench-qwen3-omni-1x2.yaml")
    talker = [s.name for s in config.stages].index("talker")
    one, count = replica_config(config, talker)
    assert count == 2
    assert one.stages[talker].max_batch_size == 32  # the seeds' max_num_seqs, each
    assert one.stages[talker].params["replicas"] == 1
    assert replica_config(config, 0) == (config, 1)


def test_the_chunk_bookkeeping_parks_waiting_requests_and_admits_ready_ones() -> None:
    queues = ChunkQueues(max_num_seqs=2)
    for k in range(5):
        queues.add(f"r{k}")
    queues.schedule(ready={"r3", "r4"}, finished=set(), scheduled=["r3", "r4"])
    # Only the ready ones were admitted; the rest were parked, then restored.
    assert [r.request_id for r in queues.running] == ["r3", "r4"]
    assert all(r.status == RUNNING for r in queues.running)
    assert [r.request_id for r in queues.waiting] == ["r0", "r1", "r2"]
    assert all(r.status == WAITING_FOR_CHUNK for r in queues.waiting)
    assert (queues.scans, queues.visits) == (1, 5)
    queues.finish("r3")
    queues.schedule(ready={"r1"}, finished=set(), scheduled=["r1"])
    # r4 ran without a new chunk: parked from the running list, restored after r1.
    assert [(r.request_id, r.status) for r in queues.running] == [
        ("r1", RUNNING),
        ("r4", WAITING_FOR_CHUNK),
    ]
    assert (queues.scans, queues.visits) == (2, 9)
    assert len(queues) == 4


@pytest.mark.parametrize("chunk_scan", [True, False])
def test_a_talker_visits_every_bound_request_on_every_schedule(chunk_scan: bool) -> None:
    """The cost per output grows with the requests in flight: with one stream fed a
    chunk per step, each step's output costs a visit of every bound request."""
    config = omnitrio.load_config(REPO / "configs" / "bench-qwen3-omni.yaml")
    settings = ModelSettings(chunk_scan=chunk_scan)
    visits_per_output = {}
    for streams in (4, 64):
        connector = _Connector(f"t5{streams}{chunk_scan}", 1, settings, sends=False)
        stage = load_stage(config, 1)
        engine = _Engine(1, 3, stage, 32, 25, settings, connector, queue.Queue())
        try:
            for k in range(streams):
                engine.add(f"s{k}", Request("hi"))
            assert engine.pick() == []  # every request waits for its first chunk
            for _ in range(10):
                with connector.lock:
                    connector.inbox["s1"].append(b"frame")
                assert [w.stream_id for w in engine.pick()] == ["s1"]
            if chunk_scan:
                assert engine.sched is not None
                assert engine.sched.scans == 11
                visits_per_output[streams] = (engine.sched.visits - streams) / 10
            else:
                assert engine.sched is None
        finally:
            connector.stop()
            stage.close()
    if chunk_scan:
        assert visits_per_output == {4: 4, 64: 64}


async def test_the_orchestrator_reports_its_longest_output_call_per_stage() -> None:
    """Seed 000's stalls: the longest ``process_outputs`` per stage and sampling
    window, the thinker's including the concatenation of a finished request's rows."""
    from benchmarks.baselines._vllm_omni_head import VllmOmniModel
    from benchmarks.harness._report import summarize_samples

    sent = [SimpleNamespace(value=4), SimpleNamespace(value=0)]
    token = trio.lowlevel.current_trio_token()
    model = VllmOmniModel("m", ModelSettings(), [], [None, None], sent, token, stage_of=[0, 1])  # type: ignore[list-item]
    state = RequestState("r1", "hi", {}, num_stages=2)
    model._states["r1"] = state
    rows = {"0": torch.ones((1, 2048), dtype=torch.bfloat16)}
    for _ in range(3):
        model._process(0, [StageOutput("r1", "a ", None, 0, False, None, rows)])
    assert len(state.accumulated[(0, "0")]) == 3  # a tensor per step until the finish
    model._process(0, [StageOutput("r1", "b ", None, 0, True, None, rows)])
    (joined,) = state.accumulated[(0, "0")]  # one torch.cat over every step's row
    assert joined.shape == (4, 2048)
    first = await model.sample()
    assert first.stall_ms["stage0"] > 0
    assert first.stall_ms["stage1"] == 0
    assert first.queue_depth == {"stage0.outputs": 0, "stage1.outputs": 0}
    second = await model.sample()  # a new window
    assert second.stall_ms == {"stage0": 0.0, "stage1": 0.0}
    assert summarize_samples([first, second]).max_stall_ms == first.stall_ms
