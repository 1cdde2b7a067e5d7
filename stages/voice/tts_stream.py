"""A Piper phrase spoken in parts: its first audio out before the whole phrase is made.

A VITS voice's graph has a seam: everything up to the sampled prior ``z_p`` (text
encoder, durations, alignment: what carries the phrase's prosody) sees the whole
phrase and is the cheap part; after it, the flow and the HiFi-GAN vocoder are a
convolution stack over the frame axis with a finite receptive field. The
``streaming-vits`` package (MIT) cuts a Piper ``.onnx`` at that seam into two graphs
(once, into the omnitrio cache). Here the front runs on the whole phrase, then the
back on frames ``[0, n)`` with ``right_frames`` of look-ahead, and later on the rest
with ``left_frames`` of context: the parts join into what one pass gives (the
margins cover the receptive field; tests/stages/voice/test_voice_stages.py compares them).

The front also gives each phoneme id's duration in frames (the graph's ``Ceil``, made an
output here), so a phrase's words can be placed on the frame axis (``word_starts``): a
first part of an answer spoken from a front pass over its first words only can stop
where a word begins, and the whole phrase's pass go on from where that word begins in
its own alignment (tts_join.py, ``first_part_words``), the two joined by a short crossfade.

With ``weights="uint8"`` (the TTS param ``voice_weights``) the back half runs on 8-bit
weights: its convolutions (most of a phrase's time: the flow and the HiFi-GAN vocoder)
quantized once into the cache by onnxruntime's dynamic quantization (per-tensor uint8
weights; activations quantized on the fly, ``ConvInteger``). The front stays float: it
is small, and on 8 bits it was no faster (docs/models.md).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx as onnx_lib
import onnxruntime

from .pcm import Floats

JOIN_FRAMES = 6  # ~70 ms: the first part's pass fades into the whole phrase's over these
WEIGHTS = ("float32", "uint8")


@dataclass
class SplitPhrase:
    """A phrase past the front half: its prior, mask and speaker (None: one speaker),
    and the next frame still to be spoken."""

    z_p: Floats  # [1, C, T]
    mask: Floats  # [1, 1, T]
    speaker: Floats | None
    durations: np.ndarray  # [N] frames per phoneme id
    next_frame: int = 0

    @property
    def num_frames(self) -> int:
        return int(self.z_p.shape[2])


class SplitVoice:
    """The two halves of a Piper voice as onnxruntime sessions."""

    def __init__(
        self,
        onnx: Path,
        sample_rate_hz: int,
        cache_root: Path,
        *,
        num_threads: int = 1,
        left_frames: int = 48,
        right_frames: int = 40,
        weights: str = "float32",
    ) -> None:
        from streaming_vits.graph import ensure_split

        if weights not in WEIGHTS:
            raise ValueError(f"voice_weights must be one of {WEIGHTS}, not {weights!r}")

        meta, folder = ensure_split(
            onnx, sample_rate=sample_rate_hz, cache=cache_root / f"{onnx.stem}-split", verbose=False
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        front = _with_durations(onnx_lib.load(str(folder / meta.frontend)))
        self._front = onnxruntime.InferenceSession(front.SerializeToString(), options, providers)
        back = folder / meta.decoder
        if weights == "uint8":
            back = ensure_u8_back(back)
        self._back = onnxruntime.InferenceSession(str(back), options, providers)
        self._front_inputs = set(meta.frontend_inputs)
        self._seam = meta.seam
        self.hop = int(meta.hop)  # samples per frame
        self.sample_rate_hz = sample_rate_hz
        self.left_frames = left_frames
        self.right_frames = right_frames

    def front(self, ids: np.ndarray, scales: Floats) -> SplitPhrase:
        """The whole phrase's prior (``ids``: [1, N] phoneme ids)."""
        feed = {
            "input": ids,
            "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
            "scales": scales,
            "sid": np.array([0], dtype=np.int64),
        }
        out = self._front.run(None, {k: v for k, v in feed.items() if k in self._front_inputs})
        durations = np.asarray(out[-1]).reshape(-1).astype(np.int64)
        return SplitPhrase(out[0], out[1], out[2] if len(out) == 4 else None, durations)

    def speak(self, phrase: SplitPhrase, num_frames: int) -> Floats:
        """The audio of the phrase's next ``num_frames`` frames (or of all that are left)."""
        start = phrase.next_frame
        end = min(phrase.num_frames, start + num_frames)
        low = max(0, start - self.left_frames)
        high = min(phrase.num_frames, end + self.right_frames)
        feed = {
            self._seam.z_p: phrase.z_p[:, :, low:high],
            self._seam.mask: phrase.mask[:, :, low:high],
        }
        if self._seam.g is not None and phrase.speaker is not None:
            feed[self._seam.g] = phrase.speaker
        audio = np.asarray(self._back.run(None, feed)[0], dtype=np.float32).reshape(-1)
        phrase.next_frame = end
        skip = (start - low) * self.hop
        return audio[skip : skip + (end - start) * self.hop]


def ensure_u8_back(back: Path) -> Path:
    """The back half's 8-bit copy beside it (``<name>.u8.onnx``), made first if it is not
    there yet (atomically: a run stopped half way leaves no file that looks done)."""
    target = back.with_suffix(".u8.onnx")
    if target.is_file():
        return target
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from tqdm import tqdm

    quiet = logging.getLogger()  # the quantizer logs advice about pre-processing
    level = quiet.level
    with tqdm(total=1, desc=f"Piper voice {back.stem}: 8-bit weights (once)") as bar:
        handle, scratch = tempfile.mkstemp(prefix=".u8-", suffix=".onnx", dir=back.parent)
        os.close(handle)
        try:
            quiet.setLevel(logging.ERROR)
            quantize_dynamic(back, scratch, weight_type=QuantType.QUInt8)
            os.replace(scratch, target)
        finally:
            quiet.setLevel(level)
            if os.path.exists(scratch):
                os.unlink(scratch)
        bar.update()
    return target


def _with_durations(front: onnx_lib.ModelProto) -> onnx_lib.ModelProto:
    """The front graph with its phoneme durations (the ``Ceil`` whose frames a ``CumSum``
    adds up into the alignment) as its last output."""
    graph = front.graph
    summed = {name for node in graph.node if node.op_type == "CumSum" for name in node.input}
    ceil = [n.output[0] for n in graph.node if n.op_type == "Ceil" and n.output[0] in summed]
    if len(ceil) != 1:
        raise ValueError(f"the voice's front graph has {len(ceil)} duration (Ceil) nodes, not 1")
    graph.output.append(
        onnx_lib.helper.make_tensor_value_info(ceil[0], onnx_lib.TensorProto.FLOAT, None)
    )
    return front


def word_starts(ids: Sequence[int], durations: np.ndarray, space_id: int) -> list[int]:
    """The frame where each word of a phrase begins: 0, then where each space between
    words begins (``ids``: the phrase's phoneme ids, ``durations``: frames per id)."""
    frames_before = np.concatenate([[0], np.cumsum(durations)])
    return [0] + [int(frames_before[i]) for i, symbol in enumerate(ids) if symbol == space_id]


def words_of(ids: Sequence[int], space_id: int) -> list[tuple[int, ...]]:
    """The phoneme ids of each word (split at the spaces)."""
    words: list[tuple[int, ...]] = [()]
    for symbol in ids:
        if symbol == space_id:
            words.append(())
        else:
            words[-1] += (symbol,)
    return words


def crossfade(tail: Floats, head: Floats) -> Floats:
    """``head`` with its start faded in over ``tail`` (the same sound from another pass)
    fading out; as long as ``head``."""
    n = min(tail.size, head.size)
    fade_in = (1.0 - np.cos(np.linspace(0.0, np.pi, n, dtype=np.float32))) / 2.0
    out = head.copy()
    out[:n] = tail[:n] * (1.0 - fade_in) + head[:n] * fade_in
    return out
