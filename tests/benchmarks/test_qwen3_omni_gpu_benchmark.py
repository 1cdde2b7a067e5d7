"""benchmarks/qwen3_omni_gpu.py runs end to end: on CPU with the tiny model here (a smoke
test of the script; its figures mean nothing), on a GPU wherever one is present."""

from __future__ import annotations

import argparse

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.qwen3_omni_gpu import (  # noqa: E402
    LIVE_NAME,
    build_live_model,
    measure,
    report,
)
from stages.qwen3_omni.weights import register_live_model, unregister_live_model  # noqa: E402
from tests.stages.qwen3_omni.test_qwen3_omni import DEVICES  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`")


@pytest.mark.parametrize("device", DEVICES)
async def test_the_benchmark_measures_both_targets_side_by_side(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.set_num_threads(1)
    args = argparse.Namespace(
        device=device, streams=[1, 2], fast_paths=["off"], max_tokens=6, max_frames=12
    )
    live = build_live_model("tiny", device)
    register_live_model(LIVE_NAME, live)
    try:
        results = await measure(args, live)
    finally:
        unregister_live_model(LIVE_NAME)
    assert set(results) == {"generate", "pipeline[off]"}
    for per_streams in results.values():
        for streams in (1, 2):
            summary = per_streams[streams]
            assert summary["num_completed"] == streams
            assert summary["ttfa_s"]["median"] > 0
            assert summary["audio_rtf"]["median"] > 0
            assert 0 <= summary["continuity_rate"] <= 1
    report(results, [1, 2])
    assert "pipeline[off]" in capsys.readouterr().out
