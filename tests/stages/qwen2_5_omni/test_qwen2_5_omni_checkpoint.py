"""The tiny Qwen2.5-Omni checkpoint: what it writes, and loud loading of each stage."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from tests.qwen2_5_omni_helpers import (
    split_published,
    tiny_checkpoint,  # noqa: F401 - a fixture
)

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from stages._torch_device import DeviceError  # noqa: E402
from stages.qwen2_5_omni.loading import StageWeightsError  # noqa: E402
from stages.qwen2_5_omni.talker import Qwen2_5OmniTalker  # noqa: E402
from stages.qwen2_5_omni.thinker import Qwen2_5OmniThinker  # noqa: E402
from stages.qwen2_5_omni.token2wav import Qwen2_5OmniToken2Wav  # noqa: E402


def test_writes_the_composite_model_and_one_folder_per_stage(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    for folder in ("", "thinker", "talker", "token2wav"):
        assert (tiny_checkpoint / folder / "config.json").is_file()
        assert (tiny_checkpoint / folder / "model.safetensors").is_file()
        assert (tiny_checkpoint / folder / "spk_dict.pt").is_file()
    for folder in ("", "thinker"):
        assert (tiny_checkpoint / folder / "tokenizer.json").is_file()
        assert (tiny_checkpoint / folder / "preprocessor_config.json").is_file()


def test_a_published_checkpoint_is_split_keeping_what_audio_on_vllm_reads(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    tmp_path: pathlib.Path,
) -> None:
    """The stage folders hold the composite's weights; the top keeps the composite, the
    processor config and the tokenizer's media tokens (vLLM's audio input builds its
    processor there); the thinker's folder gets the tokenizer and processor files too."""
    from transformers import AutoTokenizer

    split = split_published(tiny_checkpoint, tmp_path)
    for folder in ("thinker", "talker", "token2wav"):
        assert (split / folder / "spk_dict.pt").is_file()
        got = safetensors_torch.load_file(split / folder / "model.safetensors")
        want = safetensors_torch.load_file(tiny_checkpoint / folder / "model.safetensors")
        assert got.keys() == want.keys(), folder
        assert all(torch.equal(got[key], want[key]) for key in want), folder
    for folder in (split, split / "thinker"):
        processor = (folder / "processor_config.json").read_text()
        assert processor == (tiny_checkpoint / "processor_config.json").read_text()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert (tokenizer.audio_token, tokenizer.image_token) == ("<|AUDIO|>", "<|IMAGE|>")
    for name in ("model.safetensors", "config.json", "spk_dict.pt", "preprocessor_config.json"):
        assert (split / name).read_bytes() == (tiny_checkpoint / name).read_bytes(), name


def test_split_checkpoint_refuses_a_folder_without_speakers(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnitrio._cli import main

    (tmp_path / "config.json").write_text("{}")
    split = ["split-checkpoint", str(tmp_path), str(tmp_path / "s"), "--family", "qwen2.5-omni"]
    assert main(split) == 2
    assert "no spk_dict.pt" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_the_composite_model_generates_text_and_audio(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello there"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, return_tensors="pt").input_ids
    talker = model.config.talker_config
    sequences, wave = model.generate(
        ids,
        speaker="Ethan",
        thinker_max_new_tokens=4,
        talker_max_new_tokens=8,
        talker_do_sample=False,
        talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
    )
    assert sequences.shape[1] > ids.shape[1]
    assert wave.ndim == 1
    assert wave.numel() > 0
    assert torch.isfinite(wave).all()
    assert wave.abs().max() > 1e-3  # audible: PCM16 comparisons are not vacuous


def test_each_stage_loads_its_own_folder(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    tmp_path: pathlib.Path,
) -> None:
    # Each stage folder gets a marker no other folder has: every weight in it set to a
    # value of its own. The composite folder at the top holds every weight too (with a
    # prefix, which from_pretrained would strip), so a stage that loaded it, or a
    # sibling's folder, would hold other values.
    checkpoint = tmp_path / "marked"
    shutil.copytree(tiny_checkpoint, checkpoint)
    markers: dict[str, tuple[set[str], float]] = {}
    for index, folder in enumerate(("thinker", "talker", "token2wav")):
        weights = checkpoint / folder / "model.safetensors"
        tensors = safetensors_torch.load_file(weights)
        marker = 0.25 * (index + 1)
        marked = {k for k, t in tensors.items() if t.is_floating_point()}
        for key in marked:
            tensors[key] = torch.full_like(tensors[key], marker)
        safetensors_torch.save_file(tensors, weights, metadata={"format": "pt"})
        markers[folder] = (marked, marker)
    stages = {
        "thinker": Qwen2_5OmniThinker("thinker", model_path=str(checkpoint)),
        "talker": Qwen2_5OmniTalker("talker", model_path=str(checkpoint)),
        "token2wav": Qwen2_5OmniToken2Wav("token2wav", model_path=str(checkpoint)),
    }
    try:
        for folder, stage in stages.items():
            marked, marker = markers[folder]
            loaded = stage.model.state_dict()
            # transformers may load a file's `x` as the model's `model.x`
            checked = {k for k in loaded if k in marked or k.removeprefix("model.") in marked}
            assert len(checked) > 10, f"{folder}: {len(checked)} weights to check"
            wrong = [k for k in sorted(checked) if not torch.all(loaded[k] == marker)]
            assert wrong == [], f"{folder} did not load {folder}/: {wrong[:3]}"
    finally:
        for stage in stages.values():
            stage.close()


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_a_weight_key_problem_names_the_stage_and_the_key(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
    tmp_path: pathlib.Path,
    change: str,
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint / "talker", broken / "talker")
    weights = broken / "talker" / "model.safetensors"
    tensors = safetensors_torch.load_file(weights)
    if change == "missing":
        key = "codec_head.weight"
        del tensors[key]
    else:
        key = "surplus.weight"
        tensors[key] = torch.zeros(2)
    safetensors_torch.save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(StageWeightsError, match=rf"stage 'voice'.*{change} keys: {key}"):
        Qwen2_5OmniTalker("voice", model_path=str(broken))


def test_a_missing_folder_says_how_to_make_one(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="make-tiny-model"):
        Qwen2_5OmniTalker("talker", model_path=str(tmp_path / "nowhere"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a CUDA GPU")
def test_cuda_without_a_gpu_is_refused_clearly(
    tiny_checkpoint: pathlib.Path,  # noqa: F811
) -> None:
    for stage in (Qwen2_5OmniThinker, Qwen2_5OmniTalker, Qwen2_5OmniToken2Wav):
        with pytest.raises(DeviceError, match=r"stage 'x': device 'cuda' needs a CUDA GPU"):
            stage("x", "cuda", model_path=str(tiny_checkpoint))
