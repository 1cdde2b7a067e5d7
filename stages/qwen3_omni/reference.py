"""transformers' monolithic ``generate(return_audio=True)`` as a benchmark baseline.

``omnitrio bench --config configs/qwen3-omni-tiny.yaml --model-path DIR
--monolithic stages.qwen3_omni.reference:monolithic`` runs it beside the
pipelined stages on the same checkpoint: one request at a time, greedy, the
answer's text and audio delivered when ``generate`` returns (seed 004's
no-async-chunk reference). The model loads from the composite checkpoint at the
root of the folder the stages' ``model_path`` names.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from omnitrio import AudioChunk, PipelineConfig, Request, TextDelta, VisibleItem

SAMPLE_RATE_HZ = 24_000
DEFAULT_MAX_TOKENS = 64  # the tiny config's thinker default
DEFAULT_MAX_FRAMES = 256  # and its talker's


class ReferenceGenerate:
    """Greedy ``generate(return_audio=True)`` for one request at a time."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        # A Qwen3OmniMoeForConditionalGeneration on any device: loaded from a folder, or
        # the very model a pipeline's stages serve (a live model: weights.py).
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def from_folder(cls, model_path: Path, num_threads: int = 1) -> ReferenceGenerate:
        torch.set_num_threads(num_threads)
        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_path).eval()
        return cls(model, AutoTokenizer.from_pretrained(model_path))

    def __call__(self, request: Request) -> list[VisibleItem]:
        messages = [{"role": "user", "content": request.text}]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        input_ids = torch.tensor([self.tokenizer(text)["input_ids"]], device=self.model.device)
        with torch.inference_mode(), warnings.catch_warnings():
            # generate() warns about its own talker call; that is the reference's business.
            warnings.filterwarnings("ignore", "Passing `repetition_penalty` with `inputs_embeds`")
            sequences, wav = self.model.generate(
                input_ids,
                thinker_max_new_tokens=(
                    DEFAULT_MAX_TOKENS
                    if request.options.max_tokens is None
                    else request.options.max_tokens
                ),
                thinker_do_sample=False,
                thinker_eos_token_id=self.tokenizer.eos_token_id,
                talker_do_sample=False,
                talker_max_new_tokens=int(
                    request.options.knobs.get("talker.max_tokens") or DEFAULT_MAX_FRAMES
                ),
            )
        answer = sequences[0, input_ids.shape[1] :].tolist()
        items: list[VisibleItem] = [
            TextDelta(self.tokenizer.decode([token], skip_special_tokens=True)) for token in answer
        ]
        if wav is not None:
            pcm = (wav.reshape(-1).float().clamp(-1, 1) * 32767).round().to(torch.int16).cpu()
            items.append(AudioChunk(pcm.numpy().astype("<i2").tobytes(), SAMPLE_RATE_HZ))
        return items


def monolithic(config: PipelineConfig) -> ReferenceGenerate:
    """The ``--monolithic`` factory: the model of the config's first stage's ``model_path``."""
    model_path = config.stages[0].params.get("model_path")
    if not isinstance(model_path, str):
        raise ValueError(f"stage {config.stages[0].name!r} has no model_path; pass --model-path")
    return ReferenceGenerate.from_folder(Path(model_path))
