"""Where a Qwen3-Omni stage's model comes from: its checkpoint folder, or a model in memory.

``model_path: DIR`` — the folder holds ``thinker/``, ``talker/`` and ``code2wav/``
(each stage loads its own, loudly: ``stages/_torch_loading.py``) and the composite
``config.json`` at its root (``omnitrio make-tiny-model`` or
``omnitrio split-checkpoint`` write such a folder).

``live_model: NAME`` — a composite ``Qwen3OmniMoeForConditionalGeneration``
registered in this process with ``register_live_model``: the GPU benchmark builds
the full-size architecture with random weights straight on the GPU (nothing
downloaded, nothing written to disk) and serves the same modules to the stages and
to transformers' ``generate``, one copy of the weights. A stage never moves a live
model: its device must be the one the model is on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor

from stages.kit import DeviceError, WeightsError, load_pretrained


@dataclass(frozen=True)
class LiveModel:
    model: Any  # Qwen3OmniMoeForConditionalGeneration, on its device, in eval mode
    tokenizer: PreTrainedTokenizerBase
    features: WhisperFeatureExtractor


_live: dict[str, LiveModel] = {}


def register_live_model(name: str, live: LiveModel) -> None:
    """Make ``live`` available to stages configured with ``live_model: name``."""
    _live[name] = live


def unregister_live_model(name: str) -> None:
    _live.pop(name, None)


class ModelSource:
    """One stage's view of its checkpoint: its module, the composite config's ids,
    the tokenizer and the feature extractor (the thinker's)."""

    def __init__(
        self, stage: str, device: torch.device, model_path: str | None, live_model: str | None
    ) -> None:
        if (model_path is None) == (live_model is None):
            raise WeightsError(
                f"stage {stage!r}: give exactly one of model_path (a checkpoint folder) and "
                "live_model (a model registered in this process)"
            )
        self.stage = stage
        self.device = device
        self.folder = None if model_path is None else Path(model_path)
        self.live = None
        if live_model is not None:
            if live_model not in _live:
                known = ", ".join(sorted(_live)) or "none"
                raise WeightsError(
                    f"stage {stage!r}: no live model {live_model!r} is registered in this "
                    f"process (registered: {known}); register_live_model() it before the "
                    "pipeline opens, or give model_path"
                )
            self.live = _live[live_model]
            model_device = self.live.model.device
            if model_device != device:
                raise DeviceError(
                    f"stage {stage!r}: the live model {live_model!r} is on {model_device}, the "
                    f"stage's device is {device}; set the stage's device to {model_device}"
                )

    def module(self, part: str, model_class: Any) -> Any:
        """The ``thinker``, ``talker`` or ``code2wav`` model on the stage's device."""
        if self.live is not None:
            return getattr(self.live.model, part)
        assert self.folder is not None
        return load_pretrained(model_class, self.folder / part, stage=self.stage).to(self.device)

    def composite(self, key: str) -> Any:
        """A value of the composite config (``tts_pad_token_id``, ``talker_config``...)."""
        if self.live is not None:
            value = getattr(self.live.model.config, key)
            return value.to_dict() if hasattr(value, "to_dict") else value
        assert self.folder is not None
        config = self.folder / "config.json"
        if not config.is_file():
            raise WeightsError(f"stage {self.stage!r}: {str(self.folder)!r} has no config.json")
        return json.loads(config.read_text())[key]

    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self.live is not None:
            return self.live.tokenizer
        from transformers import AutoTokenizer

        assert self.folder is not None
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.folder / "thinker")
        return tokenizer

    def features(self) -> WhisperFeatureExtractor:
        if self.live is not None:
            return self.live.features
        assert self.folder is not None
        return WhisperFeatureExtractor.from_pretrained(self.folder / "thinker")
