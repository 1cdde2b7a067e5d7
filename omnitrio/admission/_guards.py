"""Two guards beside the stages' step-time models, for what those models cannot see.

- **Warm-up** (``pipeline.warmup_streams``, opt-in). Before any stage's model has an
  opinion (``StepModel.ready``: its first steps and the pipeline's first audio),
  nothing is known of what a stream costs, and a first wave that arrives at once is
  admitted blind up to ``max_streams``. With ``warmup_streams`` set, it is admitted up
  to that many; the rest are refused until a model is ready, a stream completed or
  ``WARMUP_MAX_S`` passed (a pipeline that makes no audio has no model to wait for).
  Nothing tells a first stage that keeps a whole batch in real time from one that
  does not before the first audio, so this is the operator's: a small window keeps a
  first wave within the limit at the cost of its admission wait (on
  ``bench-omni.yaml`` half a batch cost a closed loop of 64 a 0.6 s ramp; TTFA p99
  3.5x), one batch costs a pipeline that keeps a batch nothing.
- **Lateness.** Each stage's model is its own; none sees what the stages do to one
  another (windows of several stages falling due at once, host time that holds the
  GIL on shared cores). What they miss shows at the client: a stream's *lag* at an
  audio chunk is how long a player that started at its first chunk has waited for
  it (``StreamState.lag_s``, the same anchor as the playback deadline). While some
  live stream's lag is over ``LATE_SHARE`` of the client buffer, no stream is admitted:
  the pipeline is already not keeping the streams it has.
- **Startup** (``admission: cpu``). Where the stages share a few cores, a new stream's
  way to its first audio (its recognition, its prompt, its first phrase: what a voice
  chat puts first) takes them from the streams already playing, which make little
  audio meanwhile. A playing stream with less audio ahead of its playback deadline
  (``StreamState.deadline_s``) than a new stream's startup (the time from admission
  to first audio lately) would run dry through it: while one has, nothing is admitted.
  Only streams that have played audio count: one on its way to its first audio has no
  playback yet (counting it at the slack its first chunk would give made two requests
  that arrive together a refusal for the second, three clients' speech beside row 4's
  attacker cut to an error), and one that plays no audio (a transcription) never has.
  Nor does one already past its playback deadline (it ran dry: refusing others can no
  longer keep it), nor one longer than ``GUARDED_LENGTHS`` usual answers (``guards``):
  beside row 4's "W." x 100, made at about real time for half a minute, the guard
  refused every other client's speech while it played. Where requests may wait to be
  admitted (``pipeline.admission_wait_s``, ``_wait.py``), the guard also holds a new
  stream that plays audio while another is on its way to its first audio (admitted,
  none yet, not past its first-audio budget): two startups at once take the cores
  from each other and from the playing streams. Refusing for that failed the second
  of two requests that arrive together; waiting delays it until the first one plays.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._headroom import StepModel

LATE_SHARE = 0.5
"""A live stream this share of ``client_buffer_s`` behind its playback stops admission."""
WARMUP_MAX_S = 2.0
"""The longest warm-up (s) after the first admission it judged."""


class Warmup:
    """The warm-up's window. It is over for good once some stage's model is ready, a
    stream completed (the models have what they will get: a pipeline that makes no
    audio never readies them), or ``WARMUP_MAX_S`` after the first admission it judged."""

    def __init__(self, warmup_streams: int | None = None) -> None:
        self.warmup_streams = warmup_streams
        self.over = False
        self._started_s: float | None = None

    def window(
        self,
        models: Sequence[tuple[str, StepModel]],
        max_streams: int,
        audio_s: float,
        now_s: float | None = None,
    ) -> int | None:
        """The most live streams admitted now (None: no warm-up is set, it is over, or
        there are no stages): ``warmup_streams``, within ``max_streams``."""
        if self.warmup_streams is None:
            return None
        if not self.over and now_s is not None:
            if self._started_s is None:
                self._started_s = now_s
            self.over = now_s - self._started_s > WARMUP_MAX_S
        if not models or any(model.ready(audio_s) for _, model in models):
            self.over = True
        if self.over:
            return None
        return min(max_streams, self.warmup_streams)

    def problem(
        self,
        models: Sequence[tuple[str, StepModel]],
        max_streams: int,
        audio_s: float,
        num_live: int,
        now_s: float | None = None,
    ) -> str | None:
        """Why one more stream is refused during the warm-up (None: it is not)."""
        window = self.window(models, max_streams, audio_s, now_s)
        if window is None or num_live < window:
            return None
        return (
            f"no stage has a step-time model yet and {num_live} streams are live "
            "(pipeline.warmup_streams)"
        )


def lateness_problem(most_lag_s: float, client_buffer_s: float) -> str | None:
    """Why one more stream is refused while the live streams' largest lag is
    ``most_lag_s`` (None: it is not)."""
    if most_lag_s <= LATE_SHARE * client_buffer_s:
        return None
    return (
        f"a live stream's audio came {most_lag_s:.2f} s after its client ran out "
        f"(over {LATE_SHARE:.0%} of pipeline.client_buffer_s)"
    )


STARTUP_KEEP = 0.9
"""Weight of the past in the mean startup and audio (per stream with audio)."""
GUARDED_LENGTHS = 2.0
"""The startup guard keeps a stream while its audio is at most this many usual answers'."""


class Startup:
    """The startup guard's means: a stream's time from admission to its first audio,
    and its audio, lately (None before a stream completed with audio)."""

    def __init__(self) -> None:
        self.mean_s: float | None = None
        self.mean_audio_s: float | None = None

    def completed(self, startup_s: float, audio_s: float) -> None:
        """A stream had its first audio ``startup_s`` after its admission, ``audio_s``
        in all."""
        self.mean_s = _mean(self.mean_s, startup_s)
        self.mean_audio_s = _mean(self.mean_audio_s, audio_s)

    def guards(self, audio_s: float) -> bool:
        """Whether a playing stream with ``audio_s`` of audio so far holds admission
        while it is close to its deadline: at most ``GUARDED_LENGTHS`` usual answers."""
        usual_s = self.mean_audio_s
        return usual_s is None or audio_s <= GUARDED_LENGTHS * usual_s

    def problem(self, least_slack_s: float) -> tuple[str, float] | None:
        """Why one more stream is refused while the live streams it guards have at
        least ``least_slack_s`` (not below 0) to their playback deadlines, and when that stream,
        making audio at twice real time, would be a startup from its deadline (None:
        it is not)."""
        startup_s = self.mean_s
        if startup_s is None or least_slack_s >= startup_s:
            return None
        problem = (
            f"a live stream is {least_slack_s:.2f} s from its playback deadline, less than "
            f"a new stream's {startup_s:.2f} s to its first audio on the shared cores"
        )
        return problem, startup_s - least_slack_s

    def starting_problem(self, oldest_start_s: float | None) -> tuple[str, float] | None:
        """Why a new stream that plays audio waits while another, admitted
        ``oldest_start_s`` ago, is on its way to its first audio, and when that one's
        first audio is due (None: it does not: none is starting, or no startup is known
        yet)."""
        startup_s = self.mean_s
        if oldest_start_s is None or startup_s is None:
            return None
        problem = (
            f"a stream admitted {oldest_start_s:.2f} s ago is on its way to its first audio "
            f"({startup_s:.2f} s lately); two startups on the shared cores would each take "
            "longer (pipeline.admission_wait_s)"
        )
        return problem, startup_s - oldest_start_s


def _mean(mean: float | None, value: float) -> float:
    return value if mean is None else mean * STARTUP_KEEP + value * (1 - STARTUP_KEEP)
