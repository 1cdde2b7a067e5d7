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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime

from .pcm import Floats


@dataclass
class SplitPhrase:
    """A phrase past the front half: its prior, mask and speaker (None: one speaker),
    and the next frame still to be spoken."""

    z_p: Floats  # [1, C, T]
    mask: Floats  # [1, 1, T]
    speaker: Floats | None
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
    ) -> None:
        from streaming_vits.graph import ensure_split

        meta, folder = ensure_split(
            onnx, sample_rate=sample_rate_hz, cache=cache_root / f"{onnx.stem}-split", verbose=False
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        self._front = onnxruntime.InferenceSession(str(folder / meta.frontend), options, providers)
        self._back = onnxruntime.InferenceSession(str(folder / meta.decoder), options, providers)
        self._front_inputs = set(meta.frontend_inputs)
        self._seam = meta.seam
        self.hop = int(meta.hop)  # samples per frame
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
        return SplitPhrase(out[0], out[1], out[2] if len(out) == 3 else None)

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
