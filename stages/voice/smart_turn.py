"""Smart Turn v3.2: does the speech so far end the speaker's turn?

The model (``smart-turn-v3.2-cpu.onnx``, 8.7 MB, BSD-2) ships inside the
``pipecat-ai`` package, installed without its dependencies: only the file is used.
It takes the last 8 s of 16 kHz audio (zeros before a shorter utterance) as
Whisper-style log-mel features ``input_features``: [1, 80, 800] (the waveform
normalized to zero mean and unit variance first), and returns the probability
that the turn is finished. One decision costs ~50 ms on one thread.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime

from .files import INSTALL_HINT, existing_path, package_dir
from .pcm import Floats

RATE_HZ = 16000
WINDOW_S = 8
MODEL_FILE = Path("audio") / "turn" / "smart_turn" / "data" / "smart-turn-v3.2-cpu.onnx"


def packaged_model() -> Path:
    """The model file inside the ``pipecat-ai`` package (found without importing it)."""
    return package_dir("pipecat", INSTALL_HINT) / MODEL_FILE


class SmartTurn:
    """``probability_finished(samples)``: the model's verdict on 16 kHz float samples."""

    def __init__(self, model_path: str | None = None, *, num_threads: int = 1) -> None:
        from transformers import WhisperFeatureExtractor

        path = packaged_model() if model_path is None else Path(model_path)
        path = existing_path("smart_turn_path", str(path))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._features = WhisperFeatureExtractor(
            feature_size=80, sampling_rate=RATE_HZ, chunk_length=WINDOW_S, n_fft=400, hop_length=160
        )
        self.num_decisions = 0

    def probability_finished(self, samples: Floats) -> float:
        window = RATE_HZ * WINDOW_S
        last = samples[-window:]
        padded = np.pad(last, (window - last.size, 0))  # zeros before a short utterance
        features = self._features(
            padded,
            sampling_rate=RATE_HZ,
            return_tensors="np",
            padding="max_length",
            max_length=window,
            truncation=True,
            do_normalize=True,
        ).input_features  # input_features: [1, 80, 800]
        (out,) = self._session.run(None, {"input_features": features.astype(np.float32)})
        self.num_decisions += 1
        return float(np.asarray(out).reshape(-1)[0])
