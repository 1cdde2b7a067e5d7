"""The batched KV cache (stages/_torch_slots.py): a decode step over slots written in place
gives each stream the logits it gets alone, whatever the slots' lengths, order, growth and
releases, and moves nothing it does not attend."""

from __future__ import annotations

import pathlib

import pytest

from tests.qwen2_5_omni_helpers import tiny_checkpoint, tiny_config  # noqa: F401

torch = pytest.importorskip("torch")

from transformers import DynamicCache  # noqa: E402

from stages._torch_slots import FIRST_POSITIONS, FIRST_SLOTS, KVSlots, SlotKV  # noqa: E402
from stages.qwen2_5_omni.thinker import Qwen2_5OmniThinker  # noqa: E402

SLOT_LOGITS_ATOL = 1e-5


def _prefilled(model: object, prompt: torch.Tensor) -> DynamicCache:
    cache = DynamicCache()
    length = prompt.shape[1]
    positions = torch.arange(length).view(1, 1, length).expand(4, 1, length)
    model(input_ids=prompt, position_ids=positions, past_key_values=cache, use_cache=True)  # type: ignore[operator]
    return cache


def _alone(model: object, cache: DynamicCache, token: int) -> torch.Tensor:
    length = cache.get_seq_length()
    positions = torch.full((4, 1, 1), length)
    out = model(  # type: ignore[operator]
        input_ids=torch.tensor([[token]]),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[0, -1]


def _step(pool: KVSlots, model: object, kvs: list[SlotKV], tokens: list[int]) -> list[torch.Tensor]:
    positions = torch.tensor([kv.length for kv in kvs]).view(1, -1, 1).expand(4, -1, 1)
    out, rows = pool.decode(model, kvs, positions, input_ids=torch.tensor(tokens)[:, None])
    return [out.logits[row, -1] for row in rows]


@torch.no_grad()
def test_slot_decode_equals_each_stream_alone_through_growth_releases_and_subsets(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    stage = Qwen2_5OmniThinker("thinker", model_path=str(tiny_checkpoint))
    model = stage.model
    generator = torch.Generator().manual_seed(0)
    # More streams than the first slots, one longer than the first positions: both grow.
    lengths = (3, 9, 17, 30, FIRST_POSITIONS - 2, 5)
    assert len(lengths) > FIRST_SLOTS
    prompts = [torch.randint(0, 256, (1, n), generator=generator) for n in lengths]
    pool = KVSlots()
    kvs = [pool.adopt(_prefilled(model, p)) for p in prompts]
    single = [_prefilled(model, p) for p in prompts]
    worst = 0.0
    live = list(range(len(prompts)))
    for step in range(10):
        if step == 3:
            kvs[1].release()  # a stream in the middle ends: the last one moves into its slot
            live.remove(1)
        if step == 6:
            kvs[4].release()
            live.remove(4)
        # every other step runs a subset in reverse order (filler rows in between)
        running = live if step % 2 == 0 else live[::-2]
        tokens = torch.randint(0, 256, (len(running),), generator=generator).tolist()
        together = _step(pool, model, [kvs[i] for i in running], tokens)
        for index, token, logits in zip(running, tokens, together, strict=True):
            alone = _alone(model, single[index], token)
            worst = max(worst, float((alone - logits).abs().max()))
        for index in running:
            assert kvs[index].length == single[index].get_seq_length()
    stage.close()
    print(f"slot decode vs each stream alone: max abs logits difference {worst:.2e}")
    assert worst <= SLOT_LOGITS_ATOL
    assert pool.num_slots >= len(lengths)
    assert pool.num_positions > FIRST_POSITIONS
    assert sorted(kv.slot for kv in pool.owners) == list(range(len(live)))


@torch.no_grad()
def test_a_released_slot_cannot_decode_and_releases_once(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    stage = Qwen2_5OmniThinker("thinker", model_path=str(tiny_checkpoint))
    pool = KVSlots()
    kv = pool.adopt(_prefilled(stage.model, torch.tensor([[1, 2, 3]])))
    assert kv.nbytes() == 3 * pool.bytes_per_position > 0
    kv.release()
    kv.release()  # idempotent
    assert pool.owners == []
    assert kv.nbytes() == 0
    with pytest.raises(ValueError, match="released"):
        _step(pool, stage.model, [kv], [1])
    stage.close()
