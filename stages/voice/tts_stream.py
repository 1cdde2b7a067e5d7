"""A Piper phrase spoken in parts: its first audio out before the whole phrase is made.

A VITS voice's graph has a seam: everything up to the sampled prior ``z_p`` (text
encoder, durations, alignment: what carries the phrase's prosody) sees the whole
phrase and is the cheap part; after it, the flow and the HiFi-GAN vocoder are a
convolution stack over the frame axis with a finite receptive field. The
``streaming-vits`` package (MIT) cuts a Piper ``.onnx`` at that seam into two graphs
(once, into the omnitrio cache). Here the front runs on the whole phrase, then the
back on frames ``[0, n)`` with ``right_frames`` of look-ahead, and later on the rest
with ``left_frames`` of context: the parts join into what one pass gives (the
margins cover the receptive field; tests/stages/voice/test_voice_tts_stream.py compares
them). The back's receptive field is wide on paper (the flow's and the vocoder's
convolutions add up to ~40 frames each way) but what reaches past ~20 frames is
negligible: measured on four phrases of the joe voice, first chunks of 16-40 frames
differ from the voice's one pass by at most 7e-4 (0.1 % of the peak) with 20 frames of
look-ahead (up to 0.014 with 16), and the rest not at all with 24 frames of context; a
first chunk of 32 frames is then made from 52 frames, not 72 (~30 % less work on the
first audio's path). The TTS params ``chunk_right_frames`` (20) and
``chunk_left_frames`` (24) set them; 40 and 48 cover the whole field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx as onnx_lib
import onnxruntime

from .pcm import Floats

JOIN_FRAMES = 6  # ~70 ms: the first part's pass fades into the whole phrase's over these
MIN_PART_FRAMES = 32  # a phrase spoken in parts: the least its parts may be (tts.py)


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
        left_frames: int = 24,
        right_frames: int = 20,
    ) -> None:
        from streaming_vits.graph import ensure_split

        for param, frames in (
            ("chunk_left_frames", left_frames),
            ("chunk_right_frames", right_frames),
        ):
            if frames < 0:
                raise ValueError(f"{param} must not be negative, got {frames}")

        meta, folder = ensure_split(
            onnx, sample_rate=sample_rate_hz, cache=cache_root / f"{onnx.stem}-split", verbose=False
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False  # as the whole voice's: no long phrase's peak kept
        providers = ["CPUExecutionProvider"]
        front = _with_durations(onnx_lib.load(str(folder / meta.frontend)))
        self._front = onnxruntime.InferenceSession(front.SerializeToString(), options, providers)
        self._back = onnxruntime.InferenceSession(str(folder / meta.decoder), options, providers)
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


def part_frames(frames_left: int, max_part_frames: int | None) -> int:
    """The frames of a phrase's next part: all that are left, or the ``max_part_frames``
    at most, evened out over the parts still to speak (no short last part: each part
    costs its margins again, and a first phrase's join fades over its last frames)."""
    if max_part_frames is None or frames_left <= max_part_frames:
        return frames_left
    parts = -(-frames_left // max_part_frames)
    return -(-frames_left // parts)


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
