"""Voice activity detection with Silero VAD (the ONNX model from the ``silero-vad`` package).

One stream is one session's live microphone audio: ``inputs`` are PCM16 chunks
as they arrive, and the stage emits two kinds of visible events,
``speech_started`` (``audio_start_ms``, with ``prefix_padding_ms`` before the
first speech window) and ``speech_stopped`` (``audio_end_ms``) once speech has
been followed by ``silence_duration_ms`` of silence. Two more events are for the
server alone: ``speech_paused`` (``audio_end_ms``) once speech has been followed by
``pause_ms`` of silence, shorter than ``silence_duration_ms`` (the server may start
the answer ahead then, see omnitrio/server/_realtime.py), and ``speech_resumed`` when
speech comes back after such a pause. Times count from the
stream's first sample. A stream's request options ``threshold``,
``silence_duration_ms`` and ``prefix_padding_ms`` override the configured ones
(the Realtime session's turn_detection settings). The server turns them into the Realtime API's
server_vad events (see omnitrio/server/_side_stage.py).

Semantic end of turn (the Realtime API's semantic_vad): param ``smart_turn`` is
``off`` (the model is not loaded), ``semantic`` (streams with option ``eagerness``,
what semantic_vad maps to) or ``all`` (server_vad streams too). For those streams
Smart Turn (smart_turn.py) hears
the turn's last 8 s when the silence reaches the decision time, and the turn ends
there only if it sounds finished (probability >= ``smart_turn_threshold``);
otherwise it asks again every ``recheck_ms`` of silence, and the turn ends at the
latest after ``max_silence_ms``. The decision time is the stream's
``silence_duration_ms`` (server_vad), or for ``eagerness`` (low, medium, auto,
high) the one in ``EAGERNESS_MS``, which also gives the latest end. With
``smart_turn: off``, ``eagerness`` only picks the silence time.

Batching: every step runs one ONNX call per 32 ms window position over all
streams that have a window ready, each with its own recurrent state
(``state``: [2, B, 128]) and 64 samples of left context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime

from omnitrio import (
    Event,
    Request,
    StepLimits,
    StreamOutput,
    StreamResampler,
    StreamWork,
    VisibleItem,
)

from .files import INSTALL_HINT, cpu_only, package_dir
from .pcm import Floats, pcm16_to_float
from .smart_turn import SmartTurn
from .trace import mark

VAD_RATE_HZ = 16000
WINDOW_SAMPLES = 512  # 32 ms at 16 kHz, what the model takes
INPUT_RATE_HZ = 24000  # the default input_sample_rate_hz: the Realtime API's PCM16 rate
MAX_RESAMPLER_LAG = 2  # 16 kHz samples soxr's quick stream may owe (measured: 1 at most)
GATED_RATES_HZ = (16000, 24000, 32000, 48000)  # input rates where it owes 0 or 1 and is
# never ahead of n * 16000 // rate (tests/stages/voice: it owes up to 4 from 8 kHz, and
# is one ahead at times from 44.1 kHz: those rates get no gate)
CONTEXT_SAMPLES = 64
STATE_SHAPE = (2, 1, 128)
MODEL_FILE = "silero_vad.onnx"  # batched: input [B, 576], state [2, B, 128], sr
SINGLE_MODEL_FILE = "silero_vad_openvino_16k.onnx"  # input [1, 576], state [2, 1, 128]
MAX_EVENTS_PER_STEP = 8  # speech events one step may send a session
KEEP_SAMPLES = 8 * VAD_RATE_HZ  # what Smart Turn hears
SMART_TURN_MODES = ("off", "semantic", "all")
EAGERNESS_MS: dict[str, tuple[int, int]] = {
    "high": (300, 1000),  # (the first decision, the latest end), ms of silence
    "medium": (500, 2000),
    "auto": (500, 2000),
    "low": (800, 4000),
}


@dataclass
class _Stream:
    threshold: float
    silence_windows_to_stop: int
    prefix_padding_ms: int
    resampler: StreamResampler  # the microphone's rate -> 16 kHz, across chunks, no lag
    state: Floats = field(default_factory=lambda: np.zeros(STATE_SHAPE, np.float32))
    context: Floats = field(default_factory=lambda: np.zeros(CONTEXT_SAMPLES, np.float32))
    pending: Floats = field(default_factory=lambda: np.zeros(0, np.float32))
    num_windows: int = 0  # windows already scored
    in_speech: bool = False
    speech_windows: int = 0  # consecutive speech windows while not in speech
    silence_windows: int = 0  # consecutive silent windows while in speech
    pause_windows: int | None = None  # silent windows that make a pause; None: no pauses
    last_speech_end_ms: int = 0
    max_silence_windows: int = 0  # Smart Turn's latest end; 0: no Smart Turn
    # The scored audio Smart Turn hears (its last KEEP_SAMPLES): windows are written on
    # at ``heard_end``, and the last KEEP_SAMPLES moved to the front when the buffer is
    # full (once per KEEP_SAMPLES of audio, not a copy of 8 s per 32 ms window).
    heard_buffer: Floats = field(default_factory=lambda: np.zeros(0, np.float32))
    heard_end: int = 0

    def hear(self, window: Floats) -> None:
        """Keep ``window`` (scored audio) for Smart Turn."""
        if self.heard_buffer.size < self.heard_end + window.size:
            kept = self.recent
            if self.heard_buffer.size < 2 * KEEP_SAMPLES:
                self.heard_buffer = np.zeros(2 * KEEP_SAMPLES + WINDOW_SAMPLES, np.float32)
            self.heard_buffer[: kept.size] = kept
            self.heard_end = kept.size
        self.heard_buffer[self.heard_end : self.heard_end + window.size] = window
        self.heard_end += window.size

    @property
    def recent(self) -> Floats:
        """The last KEEP_SAMPLES of scored audio (fewer before that much was scored)."""
        return self.heard_buffer[max(0, self.heard_end - KEEP_SAMPLES) : self.heard_end]


class WindowGate:
    """Whether a live stream's next chunk can complete a window, known without the stage:
    the server holds the chunks that cannot and hands them over with the first that can
    (``input_gate``, omnitrio/server/_side_stage.py).

    A step scores the 512-sample windows that the stream's audio, resampled to 16 kHz,
    completes; one that completes none changes nothing but the resampler's state and
    the audio pending, and reports nothing. The quick resampler has put out
    ``n * 16000 // rate`` samples for the first ``n`` it took, or up to
    ``MAX_RESAMPLER_LAG`` fewer; so a chunk after which even that many cannot reach the
    end of the next window that may still be unscored completes no window, and is held.
    The stage takes the held chunks joined to that one (the quick resampler puts out the
    same samples for them joined as one by one): the same windows, probabilities and
    events, from the same step as before. A 24 kHz stream
    in 20 ms chunks completes a window in 5 of every 8 chunks; the other 3 make no
    round of the side stage (its hand-overs between the trio thread and the stage's)."""

    def __init__(self, input_sample_rate_hz: int) -> None:
        if input_sample_rate_hz <= 0:
            raise ValueError(f"input_sample_rate_hz must be positive, got {input_sample_rate_hz}")
        self.input_sample_rate_hz = input_sample_rate_hz
        self._num_samples = 0  # input samples appended, held ones included
        self._next_window_end = WINDOW_SAMPLES  # 16 kHz; no window before it is unscored

    def take(self, num_samples: int) -> bool:
        """Count ``num_samples`` more input samples; True when the chunks held so far
        (this one included) must go to the stage now: they may complete a window."""
        self._num_samples += num_samples
        most = self._num_samples * VAD_RATE_HZ // self.input_sample_rate_hz
        if most < self._next_window_end:
            return False
        least = max(0, most - MAX_RESAMPLER_LAG)  # the stage has scored least // 512 at least
        self._next_window_end = (least // WINDOW_SAMPLES + 1) * WINDOW_SAMPLES
        return True


class SileroVad:
    """Turn detection on live audio; see the module docstring."""

    @classmethod
    def input_gate(cls, params: Mapping[str, object]) -> WindowGate | None:
        """A new stream's ``WindowGate``, for the server (the stage's params: the config's);
        None at an input rate not in ``GATED_RATES_HZ`` (every chunk goes to the stage)."""
        rate = params.get("input_sample_rate_hz", INPUT_RATE_HZ)
        if isinstance(rate, bool) or not isinstance(rate, int):
            raise ValueError(f"input_sample_rate_hz must be an integer, got {rate!r}")
        return WindowGate(rate) if rate in GATED_RATES_HZ else None

    max_inputs_per_step: int | None = 10  # a step scores ~2 s of a stream at most (its
    # inputs are at most 0.2 s each: omnitrio's SideStream cuts longer ones)
    max_payloads_per_step = 0
    max_visible_per_step: int

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits:
        """What one step emits with these params (the config is checked by it)."""
        events = params.get("max_events_per_step", MAX_EVENTS_PER_STEP)  # or in **kwargs
        if isinstance(events, bool) or not isinstance(events, int) or events < 1:
            raise ValueError(f"max_events_per_step must be a positive integer, got {events!r}")
        return StepLimits(cls.max_payloads_per_step, events)

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        input_sample_rate_hz: int = INPUT_RATE_HZ,
        threshold: float = 0.5,
        min_speech_ms: int = 96,
        silence_duration_ms: int = 500,
        prefix_padding_ms: int = 300,
        pause_ms: int | None = None,
        max_events_per_step: int = MAX_EVENTS_PER_STEP,
        num_threads: int = 1,
        smart_turn: str = "off",
        smart_turn_threshold: float = 0.5,
        max_silence_ms: int = 2000,
        recheck_ms: int = 200,
    ) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {threshold}")
        cpu_only(name, device)
        self.name = name
        self.input_sample_rate_hz = input_sample_rate_hz
        self.threshold = threshold
        self.window_ms = WINDOW_SAMPLES * 1000 // VAD_RATE_HZ
        self.min_speech_windows = max(1, min_speech_ms // self.window_ms)
        self.silence_duration_ms = silence_duration_ms
        self.prefix_padding_ms = prefix_padding_ms
        if pause_ms is not None and pause_ms <= 0:
            raise ValueError(f"pause_ms must be positive or null, got {pause_ms}")
        self.pause_ms = pause_ms
        limits = self.step_limits({"max_events_per_step": max_events_per_step})
        self.max_visible_per_step = limits.max_visible_per_step
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        data = package_dir("silero_vad", INSTALL_HINT) / "data"
        self._session = onnxruntime.InferenceSession(
            str(data / MODEL_FILE), sess_options=options, providers=["CPUExecutionProvider"]
        )
        # The same network for one window of one stream (fixed shapes, 16 kHz only):
        # ~0.8x of the batched model's call, the same probabilities (see the tests); one
        # conversation's windows all take it. Absent in another package version: unused.
        single = data / SINGLE_MODEL_FILE
        self._single = (
            onnxruntime.InferenceSession(
                str(single), sess_options=options, providers=["CPUExecutionProvider"]
            )
            if single.is_file()
            else None
        )
        self._rate = np.array(VAD_RATE_HZ, dtype=np.int64)
        self.streams: dict[str, _Stream] = {}
        self.num_windows_scored = 0
        self.num_model_calls = 0
        if not 0.0 < smart_turn_threshold < 1.0:
            raise ValueError(
                f"smart_turn_threshold must be between 0 and 1, got {smart_turn_threshold}"
            )
        if smart_turn not in SMART_TURN_MODES:
            raise ValueError(f"smart_turn must be one of {SMART_TURN_MODES}, not {smart_turn!r}")
        self.smart_turn_mode = smart_turn
        self.smart_turn = SmartTurn(num_threads=num_threads) if smart_turn != "off" else None
        self.smart_turn_threshold = smart_turn_threshold
        self.max_silence_ms = max_silence_ms
        self.recheck_windows = max(1, recheck_ms // self.window_ms)
        self.turn_ends: dict[str, int] = {"finished": 0, "unfinished": 0}  # Smart Turn's verdicts

    def open_stream(self, stream_id: str, request: Request) -> None:
        options = request.options.knobs  # the turn detector's own knobs
        threshold = options.get("threshold", self.threshold)
        silence_ms = options.get("silence_duration_ms", self.silence_duration_ms)
        padding_ms = options.get("prefix_padding_ms", self.prefix_padding_ms)
        if not isinstance(threshold, int | float) or not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {threshold!r}")
        if not isinstance(silence_ms, int) or not isinstance(padding_ms, int):
            raise ValueError("silence_duration_ms and prefix_padding_ms must be integers")
        eagerness = options.get("eagerness")
        max_silence_ms = self.max_silence_ms
        if eagerness is not None:
            if eagerness not in EAGERNESS_MS:
                raise ValueError(
                    f"eagerness must be one of {sorted(EAGERNESS_MS)}, not {eagerness!r}"
                )
            first_ms, max_silence_ms = EAGERNESS_MS[str(eagerness)]
            # The session's silence wins when it sends one (the Realtime API reports it
            # in session.updated); the table's first decision time is the default.
            silence_ms = options.get("silence_duration_ms", first_ms)
        silence_windows = max(1, silence_ms // self.window_ms)
        # Quick (QQ), not the anti-aliased default: that one holds back ~21 ms of audio
        # on average (up to ~37) at 20 ms chunks, and every pause and turn end came that
        # much later; Silero hears the same speech (docs/benchmarks-voice.md, issue 24).
        resampler = StreamResampler(self.input_sample_rate_hz, VAD_RATE_HZ, quality="QQ")
        track = _Stream(float(threshold), silence_windows, padding_ms, resampler)
        if self.smart_turn is not None and (eagerness is not None or self.smart_turn_mode == "all"):
            track.max_silence_windows = max(silence_windows, max_silence_ms // self.window_ms)
        if self.pause_ms is not None:
            pause_windows = -(-self.pause_ms // self.window_ms)  # at least pause_ms
            if pause_windows < silence_windows:
                track.pause_windows = pause_windows
        self.streams[stream_id] = track

    def close_stream(self, stream_id: str) -> None:
        del self.streams[stream_id]

    def close(self) -> None:
        self.streams.clear()

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        events: dict[str, list[VisibleItem]] = {work.stream_id: [] for work in batch}
        tracks: list[tuple[str, _Stream]] = []
        for work in batch:
            track = self.streams[work.stream_id]
            tracks.append((work.stream_id, track))
            for chunk in work.inputs:
                if not isinstance(chunk, bytes):
                    raise TypeError(f"vad takes PCM16 bytes, not {type(chunk).__name__}")
                audio = track.resampler.push(pcm16_to_float(chunk))
                if audio.size:
                    track.pending = (
                        np.concatenate([track.pending, audio]) if track.pending.size else audio
                    )
        while True:
            ready = [(sid, t) for sid, t in tracks if t.pending.size >= WINDOW_SAMPLES]
            if not ready:
                break
            probabilities = self._score([t for _, t in ready])
            for (sid, track), probability in zip(ready, probabilities, strict=True):
                event = self._update(track, float(probability))
                if event is not None:
                    events[sid].append(event)
                    mark(event.name, sid)
        return {
            w.stream_id: StreamOutput(visible=tuple(events[w.stream_id]), done=w.input_closed)
            for w in batch
        }

    def _score(self, tracks: list[_Stream]) -> Floats:
        """One ONNX call for one window of every track: the speech probability of each."""
        audio = np.empty((len(tracks), CONTEXT_SAMPLES + WINDOW_SAMPLES), np.float32)
        for index, track in enumerate(tracks):  # audio: [B, 64 + 512]
            audio[index, :CONTEXT_SAMPLES] = track.context
            audio[index, CONTEXT_SAMPLES:] = track.pending[:WINDOW_SAMPLES]
        if len(tracks) == 1 and self._single is not None:
            feeds = {"input": audio, "state": tracks[0].state}
            out, new_state = self._single.run(None, feeds)
        else:
            state = np.concatenate([t.state for t in tracks], axis=1)  # state: [2, B, 128]
            feeds = {"input": audio, "state": state, "sr": self._rate}
            out, new_state = self._session.run(None, feeds)
        for index, track in enumerate(tracks):
            track.state = new_state[:, index : index + 1, :]
            track.context = audio[index, -CONTEXT_SAMPLES:]
            if track.max_silence_windows:
                track.hear(audio[index, CONTEXT_SAMPLES:])
            track.pending = track.pending[WINDOW_SAMPLES:]
            track.num_windows += 1
        self.num_windows_scored += len(tracks)
        self.num_model_calls += 1
        return np.asarray(out, dtype=np.float32).reshape(-1)  # out: [B, 1]

    def _update(self, track: _Stream, probability: float) -> Event | None:
        end_ms = track.num_windows * self.window_ms
        speech = probability >= track.threshold
        if not track.in_speech:
            track.speech_windows = track.speech_windows + 1 if speech else 0
            if track.speech_windows < self.min_speech_windows:
                return None
            track.in_speech, track.silence_windows = True, 0
            track.last_speech_end_ms = end_ms
            start_ms = end_ms - track.speech_windows * self.window_ms - track.prefix_padding_ms
            return Event("speech_started", {"audio_start_ms": max(0, start_ms)})
        if speech:
            paused = (
                track.pause_windows is not None and track.silence_windows >= track.pause_windows
            )
            track.silence_windows = 0
            track.last_speech_end_ms = end_ms
            return Event("speech_resumed", {}) if paused else None
        track.silence_windows += 1
        if track.silence_windows == track.pause_windows:
            return Event("speech_paused", {"audio_end_ms": track.last_speech_end_ms})
        if track.silence_windows < track.silence_windows_to_stop or not self._turn_ends(track):
            return None
        track.in_speech, track.speech_windows = False, 0
        return Event("speech_stopped", {"audio_end_ms": track.last_speech_end_ms})

    def _turn_ends(self, track: _Stream) -> bool:
        """Past the decision time: whether this much silence ends the turn (see the
        module docstring)."""
        if self.smart_turn is None or not track.max_silence_windows:
            return True
        if track.silence_windows >= track.max_silence_windows:
            self.turn_ends["unfinished"] += 1
            return True
        if (track.silence_windows - track.silence_windows_to_stop) % self.recheck_windows:
            return False
        finished = self.smart_turn.probability_finished(track.recent) >= self.smart_turn_threshold
        self.turn_ends["finished"] += finished
        return finished
