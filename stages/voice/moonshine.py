"""Moonshine base (English) speech recognition, run with onnxruntime.

The weights ship inside the ``moonshine-cpp`` package as onnxruntime ``.ort`` files
(``models/base-en``: an encoder, a decoder with its KV cache, a tokenizer). They are
rewritten once as plain ``.onnx`` into the omnitrio cache (ort_to_onnx.py; a few
seconds, with a progress bar): onnxruntime then expands the 8-bit weights once at
load instead of on every decoder step. Param ``model_dir`` names another folder
with the same three files (``.ort`` or ``.onnx``).

The decoder makes one token per run and so reads all its weights per token: expanded
to float32 that bounds it (~15 ms a token on 2 cores). With ``decoder_weights:
uint8`` (the default) the packaged decoder's matrix products run on 8-bit weights
(onnx_u8.py; made once into the cache beside the ``.onnx`` files, ~5 s): ~7 ms a
token, the same greedy tokens on the suite's questions. ``encoder_weights: uint8``
does the same for the encoder (~0.83x of its time, the same transcripts). ``float32``
keeps the expanded weights (and is what a ``model_dir`` takes).

The merged decoder is one ``If`` (first step / later steps); by default
(``model_files(..., split_decoder=True)``, the stage's ``split_decoder``) it is split
once into the cache as two plain models, the greedy token chosen inside them and each
step's cache bound as the next step's input (moonshine_steps.py): ~7 % less time a
step, bit for bit the same logits.

On a CPU with VNNI the stage (``signed_weights: auto``) also stores the 8-bit weights
signed (``ensure_s8``, onnx_u8.py ``with_s8_weights``): onnxruntime then multiplies
them with its VNNI kernel, the same integer products, bit for bit the same results,
~0.75x of the encoder's time.

Unlike Whisper, Moonshine's encoder takes the utterance as it is (no padding to
30 s): a 2-second question costs a 2-second encoder pass. Decoding is greedy
(start id 1, end id 2), at most ``max_tokens_per_s`` tokens per second of audio.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime
from tqdm import tqdm

from .files import INSTALL_HINT, existing_path, package_dir
from .llm_weights import default_cache_dir
from .pcm import Floats

if TYPE_CHECKING:
    import onnx

RATE_HZ = 16000
START_ID = 1
END_ID = 2
PARTS = ("encoder_model", "decoder_model_merged")
CACHE_FOLDER = "moonshine-base-en-onnx"
U8_ENCODER = "encoder_model.u8.onnx"  # made from the converted encoder (onnx_u8.py)
U8_DECODER = "decoder_model_merged.u8.onnx"  # ... and decoder
WEIGHTS = ("uint8", "float32")
MIN_SAMPLES = RATE_HZ // 10  # the encoder's convolutions need ~0.1 s


def packaged_model_dir() -> Path:
    """The ``.ort`` files inside the ``moonshine-cpp`` package."""
    return package_dir("moonshine_cpp", INSTALL_HINT) / "models" / "base-en"


def ensure_converted(cache_dir: str | None, source: Path | None = None) -> Path:
    """The cache folder holding ``encoder_model.onnx``, ``decoder_model_merged.onnx`` and
    ``tokenizer.bin`` converted from ``source`` (default: the packaged model), made first
    if it is not there yet (atomically: a half-written folder is never used)."""
    source = packaged_model_dir() if source is None else source
    folder = (Path(cache_dir) if cache_dir else default_cache_dir()) / CACHE_FOLDER
    if all((folder / f"{part}.onnx").is_file() for part in PARTS):
        return folder
    import onnx

    from .ort_to_onnx import convert_ort_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    with (
        tqdm(total=len(PARTS), desc="converting Moonshine base .ort -> .onnx (once)") as bar,
        tempfile.TemporaryDirectory(dir=folder.parent, prefix=".convert-") as scratch,
    ):
        for part in PARTS:
            bar.set_postfix_str(part)
            onnx.save(convert_ort_file(source / f"{part}.ort"), str(Path(scratch) / f"{part}.onnx"))
            bar.update()
        (Path(scratch) / "tokenizer.bin").write_bytes((source / "tokenizer.bin").read_bytes())
        if folder.exists():
            for stale in folder.iterdir():
                stale.unlink()
            folder.rmdir()
        os.replace(scratch, folder)
        os.makedirs(scratch)  # the context manager removes it again
    return folder


def ensure_u8(folder: Path, part: str) -> Path:
    """The 8-bit copy of ``folder``'s ``<part>.onnx`` (a converted model's encoder or
    decoder: ``U8_ENCODER``, ``U8_DECODER``), made first if it is not there yet
    (atomically)."""
    target = folder / f"{part}.u8.onnx"
    if target.is_file():
        return target

    from .onnx_u8 import folded, with_u8_matmuls

    with tqdm(total=2, desc=f"Moonshine {part.split('_')[0]}: 8-bit weights (once)") as bar:
        bar.set_postfix_str("fold")
        model = folded(folder / f"{part}.onnx")
        bar.update()
        bar.set_postfix_str("quantize")
        model, _ = with_u8_matmuls(model)
        save_atomically(model, target)
        bar.update()
    return target


def ensure_s8(source: Path) -> Path:
    """The copy of the 8-bit model ``source`` (in the cache) with its weights stored
    signed (onnx_u8.py ``with_s8_weights``: the same products, onnxruntime's VNNI
    kernel), beside it as ``<name>.s8.onnx``; made first (atomically) if it is not
    there or is older than ``source``."""
    target = source.with_name(f"{source.name.removesuffix('.onnx')}.s8.onnx")
    if target.is_file() and target.stat().st_mtime_ns >= source.stat().st_mtime_ns:
        return target
    import onnx

    from .onnx_u8 import with_s8_weights

    with tqdm(total=1, desc=f"Moonshine {source.name}: signed 8-bit weights (once)") as bar:
        model, _ = with_s8_weights(onnx.load(str(source)))
        save_atomically(model, target)
        bar.update()
    return target


def save_atomically(model: onnx.ModelProto, target: Path) -> None:
    """Write ``model`` to ``target`` whole or not at all (a scratch file beside it,
    renamed into place): a start that is stopped midway leaves no half-written model."""
    import onnx

    handle, scratch = tempfile.mkstemp(prefix=".made-", suffix=".onnx", dir=target.parent)
    os.close(handle)
    try:
        onnx.save(model, scratch)
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def read_tokenizer(path: Path) -> list[bytes]:
    """``tokenizer.bin``: one entry per token id, each a length byte and that many bytes."""
    data = path.read_bytes()
    tokens: list[bytes] = []
    at = 0
    while at < len(data):
        length = data[at]
        tokens.append(data[at + 1 : at + 1 + length])
        at += 1 + length
    return tokens


@dataclass(frozen=True, slots=True)
class ModelFiles:
    encoder: Path
    decoder: Path
    tokenizer: Path
    # The decoder split into its first-step and next-step models (moonshine_steps.py),
    # made from ``decoder`` into the cache; None: the merged decoder runs as it is.
    steps: tuple[Path, Path] | None = None


def ensure_steps(decoder: Path) -> tuple[Path, Path]:
    """The first-step and next-step models split from the merged ``decoder`` (an
    ``.onnx`` file in the cache), beside it as ``<name>.first.onnx`` and
    ``<name>.next.onnx``; made first (atomically) if they are not there or are older
    than ``decoder``."""
    stem = decoder.name.removesuffix(".onnx")
    targets = (decoder.with_name(f"{stem}.first.onnx"), decoder.with_name(f"{stem}.next.onnx"))
    made = decoder.stat().st_mtime_ns
    if all(t.is_file() and t.stat().st_mtime_ns >= made for t in targets):
        return targets
    import onnx

    from .moonshine_steps import split_decoder

    with tqdm(total=2, desc="Moonshine decoder: first and next steps (once)") as bar:
        models = split_decoder(onnx.load(str(decoder)))
        bar.update()
        for model, target in zip(models, targets, strict=True):
            save_atomically(model, target)
        bar.update()
    return targets


def model_files(
    model_dir: str | None,
    cache_dir: str | None,
    decoder_weights: str = "uint8",
    encoder_weights: str = "float32",
    split_decoder: bool = False,
    signed_weights: bool = False,
) -> ModelFiles:
    """The packaged model converted into the cache, or the files of param ``model_dir``;
    the decoder with ``decoder_weights``, the encoder with ``encoder_weights`` (see the
    module docstring); with ``split_decoder``, the packaged model's decoder also split
    into its first and next steps (``ModelFiles.steps``; not for a ``model_dir``); with
    ``signed_weights``, each 8-bit model's weights stored signed (``ensure_s8``: for a
    CPU with VNNI, onnx_u8.py ``cpu_has_vnni``)."""
    for param, value in (
        ("decoder_weights", decoder_weights),
        ("encoder_weights", encoder_weights),
    ):
        if value not in WEIGHTS:
            raise ValueError(f"{param} must be one of {WEIGHTS}, not {value!r}")
    if model_dir is None:
        folder = ensure_converted(cache_dir)
        suffix = ".onnx"
    else:
        folder = existing_path("model_dir", model_dir, folder=True)
        suffix = ".onnx" if (folder / f"{PARTS[0]}.onnx").is_file() else ".ort"
    files = ModelFiles(
        existing_path("model_dir", str(folder / f"{PARTS[0]}{suffix}")),
        existing_path("model_dir", str(folder / f"{PARTS[1]}{suffix}")),
        existing_path("model_dir", str(folder / "tokenizer.bin")),
    )
    if model_dir is not None:
        if encoder_weights == decoder_weights == "float32":
            return files
        raise ValueError(
            "encoder_weights / decoder_weights: uint8 is made from the packaged model "
            f"(model_dir: null); set both to float32 to run model_dir {model_dir}"
        )
    decoder = ensure_u8(folder, PARTS[1]) if decoder_weights == "uint8" else files.decoder
    encoder = ensure_u8(folder, PARTS[0]) if encoder_weights == "uint8" else files.encoder
    steps = ensure_steps(decoder) if split_decoder else None

    def signed(path: Path, eight_bit: bool) -> Path:
        return ensure_s8(path) if signed_weights and eight_bit else path

    u8_decoder = decoder_weights == "uint8"
    return ModelFiles(
        signed(encoder, encoder_weights == "uint8"),
        decoder if steps else signed(decoder, u8_decoder),
        files.tokenizer,
        None if steps is None else (signed(steps[0], u8_decoder), signed(steps[1], u8_decoder)),
    )


def _options(num_threads: int) -> onnxruntime.SessionOptions:
    """One session's options. Its pool's threads sleep between runs instead of spinning:
    each session has its own pool, and spinning ones took a core from the other session
    (the encoder's pool spun through the decoder's steps) and from the LLM's prefill
    after the transcript (docs/benchmarks-voice.md, issue 24, third pass). No memory
    arena: it kept what long transcriptions' chunks grew it to (four 56 s
    transcriptions in the server left +74 MB with it, +41 without, -0 without it and
    with the heap trimmed after uploads of 128 KiB; a 1 s transcription 46 and 39 ms
    p50; docs/reliability.md, round 3, row 7)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class Moonshine:
    """The model: ``transcribe`` 16 kHz float samples to text.

    With ``files.steps`` the decoder runs as its two split models (moonshine_steps.py),
    each step's outputs bound as the next step's inputs (onnxruntime I/O binding);
    without, the merged decoder runs as shipped (``decoder``). Both give the same
    tokens, bit for bit the same logits."""

    def __init__(
        self,
        files: ModelFiles,
        *,
        num_threads: int = 1,
        decoder_num_threads: int | None = None,
        max_tokens_per_s: float = 6.5,
    ):
        providers = ["CPUExecutionProvider"]
        self.files = files
        self.encoder = onnxruntime.InferenceSession(
            str(files.encoder), _options(num_threads), providers
        )
        decoder_threads = num_threads if decoder_num_threads is None else decoder_num_threads
        self.tokens = read_tokenizer(files.tokenizer)
        self.max_tokens_per_s = max_tokens_per_s
        self.decoder: onnxruntime.InferenceSession | None = None
        self.steps: tuple[onnxruntime.InferenceSession, onnxruntime.InferenceSession] | None
        if files.steps is None:
            self.steps = None
            self.decoder = onnxruntime.InferenceSession(
                str(files.decoder), _options(decoder_threads), providers
            )
            cache = self.decoder
        else:
            # With the shapes known, onnxruntime would fold each attention's scaling
            # into its product (FusedMatMul's alpha): not the same rounding, and the
            # 8-bit products after it amplify that (logits up to ~0.4 apart).
            # The first step runs on the encoder's threads: its products take every
            # frame of the utterance (the cross-attention's keys and values); a later
            # step's take one row.
            self.steps = tuple(
                onnxruntime.InferenceSession(
                    str(path),
                    _options(threads),
                    providers,
                    disabled_optimizers=["MatMulScaleFusion"],
                )
                for path, threads in zip(files.steps, (num_threads, decoder_threads), strict=True)
            )
            cache = self.steps[1]
        self._past = [i.name for i in cache.get_inputs() if i.name.startswith("past_")]
        if files.steps is None:
            outputs = [o.name for o in cache.get_outputs()]
            if outputs[1:] != [n.replace("past_key_values.", "present.") for n in self._past]:
                raise ValueError(f"{files.decoder}: its cache outputs do not match its inputs")
            heads, head_dim = cache.get_inputs()[2].shape[1], cache.get_inputs()[2].shape[3]
            self._empty = np.zeros((1, int(heads), 0, int(head_dim)), np.float32)
        else:
            self._bind_names()

    def _bind_names(self) -> None:
        """What the split decoder's steps hand on: the first step's outputs that every
        later step reads as they are (the cross-attention's values and scaled keys),
        and the cache each step hands the next (``present.*`` -> ``past_key_values.*``)."""
        from .moonshine_steps import SCALED_KEY, TOKEN

        assert self.steps is not None
        first, later = ([o.name for o in session.get_outputs()] for session in self.steps)
        later_inputs = {i.name for i in self.steps[1].get_inputs()}
        self._decoder_past = [n for n in self._past if ".decoder." in n]
        self._carried = [n.replace("past_key_values.", "present.") for n in self._decoder_past]
        self._fixed = {
            name: name.replace("past_key_values.", "present.")
            for name in self._past
            if ".encoder." in name
        } | {name: name for name in later_inputs if name.startswith(SCALED_KEY.split(".")[0])}
        needed = {TOKEN, *self._carried, *self._fixed.values()}
        if not needed <= set(first) or not {TOKEN, *self._carried} <= set(later):
            raise ValueError(f"{self.files.steps}: the steps' outputs do not match their inputs")
        if later_inputs != {"input_ids", *self._decoder_past, *self._fixed}:
            raise ValueError(f"{self.files.steps}: unexpected inputs of the next step")
        self._first_outputs = [TOKEN, *self._carried, *self._fixed.values()]
        self._next_outputs = [TOKEN, *self._carried]

    def encode(self, samples: Floats) -> np.ndarray:
        """The encoder's hidden states of the utterance, ``[1, frames, 416]``."""
        if samples.size < MIN_SAMPLES:
            samples = np.pad(samples, (0, MIN_SAMPLES - samples.size))
        (hidden,) = self.encoder.run(None, {"input_values": samples[None, :].astype(np.float32)})
        return hidden

    def token_ids(self, samples: Floats) -> list[int]:
        """The greedy token ids of the utterance (without the start and end ids)."""
        return self.decode(self.encode(samples), samples.size)

    def decode(self, hidden: np.ndarray, num_samples: int) -> list[int]:
        """The greedy token ids from the encoder's ``hidden`` states of an utterance
        of ``num_samples`` samples: at most ``max_tokens_per_s`` per second of audio."""
        return list(self.decoding(hidden, num_samples))

    def decoding(self, hidden: np.ndarray, num_samples: int) -> Iterator[int]:
        """``decode``'s ids one decoder run at a time: a caller may stop between two
        and go on later (asr.py slices a long utterance's steps so)."""
        limit = max(4, math.ceil(max(num_samples, MIN_SAMPLES) / RATE_HZ * self.max_tokens_per_s))
        if self.steps is not None:
            return self._decode_steps(hidden, limit)
        return self._decode_merged(hidden, limit)

    def _decode_merged(self, hidden: np.ndarray, limit: int) -> Iterator[int]:
        assert self.decoder is not None
        past = {name: self._empty for name in self._past}
        token = START_ID
        for step in range(limit):
            feed = {
                "input_ids": np.array([[token]], np.int64),
                "encoder_hidden_states": hidden,  # hidden: [1, T, 416]
                "use_cache_branch": np.array([step > 0]),
                **past,
            }
            logits, *presents = self.decoder.run(None, feed)
            for name, value in zip(self._past, presents, strict=True):
                # The encoder's keys and values are computed at the first step only.
                if step == 0 or ".decoder." in name:
                    past[name] = value
            token = int(np.argmax(logits[0, -1]))
            if token == END_ID:
                return
            yield token

    def _decode_steps(self, hidden: np.ndarray, limit: int) -> Iterator[int]:
        """``decode`` on the split decoder: no values through numpy but the token."""
        assert self.steps is not None
        first, later = self.steps
        binding = first.io_binding()
        binding.bind_cpu_input("input_ids", np.array([[START_ID]], np.int64))
        binding.bind_cpu_input("encoder_hidden_states", hidden)
        for name in self._first_outputs:
            binding.bind_output(name)
        first.run_with_iobinding(binding)
        made = dict(zip(self._first_outputs, binding.get_outputs(), strict=True))
        token, cache = made[self._first_outputs[0]], [made[n] for n in self._carried]
        step = later.io_binding()
        for name, output in self._fixed.items():  # the same at every step
            step.bind_ortvalue_input(name, made[output])
        for number in range(limit):
            if number > 0:
                step.bind_ortvalue_input("input_ids", token)
                for name, value in zip(self._decoder_past, cache, strict=True):
                    step.bind_ortvalue_input(name, value)
                for name in self._next_outputs:  # fresh outputs: the last ones are inputs now
                    step.bind_output(name)
                later.run_with_iobinding(step)
                token, *cache = step.get_outputs()
            chosen = int(token.numpy()[0, 0])
            if chosen == END_ID:
                return
            yield chosen

    def text(self, ids: list[int]) -> str:
        pieces = b"".join(self.tokens[i] for i in ids if 2 < i < len(self.tokens))
        return pieces.decode("utf-8", errors="replace").replace("\u2581", " ").strip()

    def transcribe(self, samples: Floats) -> str:
        return self.text(self.token_ids(samples))
