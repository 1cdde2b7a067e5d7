"""Shared by the Qwen2.5-Omni tests: one tiny checkpoint per session, and pipeline configs."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# Threads that come and go on their own trip the leaked-thread check of
# tests/conftest.py: tqdm's monitor (progress bars) and from_pretrained's loading
# pool (shut down without waiting for its threads).
transformers.utils.logging.disable_progress_bar()
os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"

import omnitrio  # noqa: E402
from stages.qwen2_5_omni.prompt import build_prompt  # noqa: E402
from stages.qwen2_5_omni.talker import CODES_EVENT  # noqa: E402
from stages.qwen2_5_omni.thinker import TEXT_IDS_EVENT  # noqa: E402
from stages.qwen2_5_omni.tiny import make_tiny_checkpoint  # noqa: E402
from stages.qwen2_5_omni.token2wav import to_pcm16  # noqa: E402

CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "qwen2.5-omni-tiny.yaml"
VLLM_CONFIG = CONFIG.with_name("qwen2.5-omni-tiny-vllm.yaml")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("qwen2.5-omni-tiny")
    torch.set_num_threads(1)
    make_tiny_checkpoint(directory, seed=0)
    return directory


def split_published(checkpoint: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """``checkpoint``'s top files alone (what a published folder holds), then split by
    ``omnitrio split-checkpoint --family qwen2.5-omni``, the route a real one takes."""
    from omnitrio._cli import main

    published = directory / "published"
    published.mkdir(parents=True)
    for file in checkpoint.iterdir():
        if file.is_file():
            (published / file.name).write_bytes(file.read_bytes())
    split = directory / "split"
    assert main(["split-checkpoint", str(published), str(split), "--family", "qwen2.5-omni"]) == 0
    return split


def tiny_config(
    checkpoint: pathlib.Path,
    device: str = "cpu",
    source: pathlib.Path = CONFIG,
    **stage_params: dict[str, Any],
) -> omnitrio.PipelineConfig:
    """configs/qwen2.5-omni-tiny.yaml (or ``source``) pointed at ``checkpoint``, every
    stage on ``device``, with extra params per stage."""
    import yaml

    data = yaml.safe_load(source.read_text())
    for stage in data["stages"]:
        stage["device"] = device
        stage["params"]["model_path"] = str(checkpoint)
        stage["params"].update(stage_params.get(stage["name"], {}))
    return omnitrio.parse_config(data, source=str(source))


@dataclass(frozen=True, slots=True)
class ARStageStatistics:
    """What an autoregressive stage reports (``stage_statistics()``, through the pipeline's
    statistics), in seconds. ``largest_batch_size``: most streams in one decode forward so far."""

    num_active_streams: int
    kv_bytes: int
    num_tokens: int
    largest_batch_size: int
    forward_mean_s: float
    sampling_mean_s: float
    packaging_mean_s: float  # per packaging job, on the packaging thread
    step_gap_mean_s: float  # between consecutive step starts


def ar_statistics(pipeline: omnitrio.Pipeline, name: str) -> ARStageStatistics:
    """Stage ``name``'s own figures, read from the running pipeline."""
    model = pipeline.statistics().stages[name].model
    return ARStageStatistics(
        num_active_streams=int(model["num_active_streams"]),
        kv_bytes=int(model["kv_bytes"]),
        num_tokens=int(model["num_tokens"]),
        largest_batch_size=int(model["largest_decode_batch_size"]),
        forward_mean_s=model["forward_ms_mean"] / 1000,
        sampling_mean_s=model["sampling_ms_mean"] / 1000,
        packaging_mean_s=model["packaging_ms_mean"] / 1000,
        step_gap_mean_s=model["step_gap_ms_mean"] / 1000,
    )


@dataclass(frozen=True)
class Output:
    """One stream's result: sampled text ids, codec codes (stop code excluded), PCM16."""

    text_ids: tuple[int, ...]
    codes: tuple[int, ...]
    pcm16: bytes
    text: str = ""
    sample_rates_hz: frozenset[int] = frozenset()


class Reference:
    """transformers' monolithic ``generate(return_audio=True)`` on the tiny checkpoint.

    Two taps, neither changing a computation: the talker's ``generate`` is wrapped to
    keep its codes, and token2wav returns no samples for zero codes (the reference
    itself crashes in the DiT on an empty code sequence, e.g. when the talker's first
    code is a stop code).
    """

    def __init__(self, checkpoint: pathlib.Path, device: str = "cpu") -> None:
        from transformers import (
            AutoTokenizer,
            Qwen2_5OmniForConditionalGeneration,
            WhisperFeatureExtractor,
        )

        model = Qwen2_5OmniForConditionalGeneration.from_pretrained(checkpoint).eval()
        self.model = model.to(device)
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.features = WhisperFeatureExtractor.from_pretrained(checkpoint)

    def run(
        self,
        request: omnitrio.Request,
        *,
        thinker_max_tokens: int,
        talker_max_tokens: int,
        seed: int,
        speaker: str = "Chelsie",
    ) -> Output:
        model, talker = self.model, self.model.config.talker_config
        prompt = build_prompt(request, self.tokenizer, self.features)
        captured: dict[str, list[int]] = {}
        talker_generate, token2wav_forward = model.talker.generate, model.token2wav.forward

        def keep_codes(*args: Any, **kwargs: Any) -> Any:
            out = talker_generate(*args, **kwargs)
            captured["codes"] = out[0, kwargs["input_ids"].shape[1] :].tolist()
            return out

        def decode(code: Any, **kwargs: Any) -> Any:
            return token2wav_forward(code, **kwargs) if code.shape[1] else code.new_zeros(0)

        device = model.device
        extra = {}
        if prompt.input_features is not None:
            extra = {
                "input_features": prompt.input_features.to(device),
                "feature_attention_mask": prompt.feature_attention_mask.to(device),
            }
        model.talker.generate, model.token2wav.forward = keep_codes, decode
        try:
            torch.manual_seed(seed)
            sequences, wave = model.generate(
                prompt.input_ids.to(device),
                speaker=speaker,
                thinker_max_new_tokens=thinker_max_tokens,
                talker_max_new_tokens=talker_max_tokens,
                talker_do_sample=False,
                talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
                **extra,
            )
        finally:
            del model.talker.generate, model.token2wav.forward
        stops = {talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id}
        codes = captured["codes"]
        codes = codes[: next((i for i, c in enumerate(codes) if c in stops), len(codes))]
        ids = tuple(sequences[0, prompt.input_ids.shape[1] :].tolist())
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return Output(ids, tuple(codes), to_pcm16(wave), text)


def collect_output(items: Sequence[omnitrio.VisibleItem]) -> Output:
    ids: list[int] = []
    codes: list[int] = []
    for item in items:
        if isinstance(item, omnitrio.Event) and item.name == TEXT_IDS_EVENT:
            ids += item.data["ids"]  # type: ignore[arg-type]
        elif isinstance(item, omnitrio.Event) and item.name == CODES_EVENT:
            codes += item.data["codes"]  # type: ignore[arg-type]
    audio = [i for i in items if isinstance(i, omnitrio.AudioChunk)]
    text = "".join(i.text for i in items if isinstance(i, omnitrio.TextDelta))
    return Output(
        tuple(ids),
        tuple(codes),
        b"".join(a.pcm16 for a in audio),
        text,
        frozenset(a.sample_rate_hz for a in audio),
    )


def pcm_difference(a: bytes, b: bytes) -> tuple[float, float]:
    """(max abs difference, RMS difference) as fractions of full scale; lengths must agree."""
    import numpy as np

    x = np.frombuffer(a, dtype="<i2").astype(np.float64) / 32768
    y = np.frombuffer(b, dtype="<i2").astype(np.float64) / 32768
    assert x.shape == y.shape
    if not x.size:
        return 0.0, 0.0
    return float(np.abs(x - y).max()), float(np.sqrt(np.mean((x - y) ** 2)))
