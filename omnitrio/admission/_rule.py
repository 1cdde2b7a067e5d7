"""Admission by real-time headroom, and shedding when a stage falls behind.

The rule (``docs/design.md``, "Admission"): a new stream is admitted only while,
with it, every stage's learned realtime factor (``StepModel``, ``_headroom.py``) for its
*active* streams plus the new one is at least ``needed``: ``1 + realtime_margin``
(at most: the margin a stage keeps is its own, ``_margin.py``) times ``A / (A + B)``,
``A`` the mean audio of the streams that completed with audio, less their first chunk
(before any did: ``1 + realtime_margin``), ``B`` the configured client buffer
(``pipeline.client_buffer_s``). A stream's first chunk is made before its client plays;
the ``A`` seconds after it, made at ``f`` x real time while the client plays, end
``A x (1/f - 1)`` behind its playback; a client that buffers ``B`` absorbs that while
it is at most ``B``, so a stage falls behind only below ``A / (A + B)``: short answers
tolerate a stage somewhat slower than real time (a closed loop at the limit, whose
prefills take a share of the first stage's time), long ones do not (the factor tends
to ``1 + realtime_margin``); ``max_streams`` stays a hard cap, and the first stream is
always admitted. The factor is asked twice: with the stage's first-step share lately and
with that of its last few steps (``StepModel.burst_factor``). Slots that free together
fill one arrival a step, each with a prefill, and a stream's next chunk waits behind
them: ``bench-omni.yaml``'s open loop ran 21-23 % of its streams over a 100 ms gap,
though its share over thousands of steps kept the answers' pace; a first wave's, judged
by the stage's prior, ran the rest of them over it (the prior charges a plain step). A
stage with no active stream takes no step, so its last few steps are not asked there. Two guards
cover what the models cannot see (``_guards.py``): before any model is ready a first
wave is admitted up to ``warmup_streams`` where that is set (and, where the stages
declare what a step costs, only as far as that keeps real time: ``_prior.py``), and while
a live stream is behind its playback by more than half its client buffer, nothing
is admitted. A stream is active at a stage while it has work there or had some within
the last ``ACTIVE_WINDOW_S`` (or was added there that recently): a stream the stage
holds idle (a voice chat's TTS between answers) costs it no step per round, so it is
not charged one. A stage is charged no fewer streams than any stage before it has
active: those are on their way to it. (Charged only its own, a first wave's later
cohorts, which a deadline-first thinker leaves for the first cohort after their
prefills, had no work at ``bench-qwen3-omni.yaml``'s talker for half a second, so the
talker counted 160 of 192 live streams and let a closed loop of 256 admit 64 past the
192 it keeps in real time: 224 of the first wave's 256 ran dry.)

Once streams are admitted the runtime protects them from a real, sustained slowdown
(shedding, ``_shed.py``). The retry hint of a
refusal is the time until a slot frees: how much longer the oldest live stream (the
next to end) is expected to run, given its age, by the lifetimes of the last
``LIFETIMES_KEPT`` completed streams (their mean excess over its age, among those that
ran longer); one that has outlived them all leaves the expected wait for the first of
the live streams to end, their mean lifetime over their count; at least
``MIN_RETRY_AFTER_S``;
``admission: cpu``'s startup guard's is sooner where that stream would be a startup
from its deadline sooner, making audio at twice real time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

from .._errors import Overloaded
from .._items import Request
from .._stream import StreamState
from ._cpu import CpuWatch, process_cpu_s, usable_cores
from ._guards import Startup, Warmup, lateness_problem
from ._headroom import StepModel
from ._margin import stage_margin
from ._shed import Shedding
from ._utilisation import ActiveCounts, BusyWatch, active_at, busy_problem

LIFETIMES_KEPT = 64
"""Completed streams' lifetimes kept for the retry hint (the time until a slot frees)."""
MIN_RETRY_AFTER_S = 0.05
MAX_RETRY_AFTER_S = 60.0
ACTIVE_WINDOW_S = 0.5
"""A stream with no work at a stage for this long is idle there (not charged a step)."""
AUDIO_KEEP = 0.9
"""Weight of the past in the mean audio of completed streams (per completion)."""


def _factor(model: StepModel, num_streams: int, audio_s: float, stepping: bool) -> float:
    """The stage's realtime factor for ``num_streams``, lately and, while the stage is
    ``stepping`` (it has active streams), over its last few steps
    (``StepModel.burst_factor``), whichever is less. A stage with no active stream
    takes no step, so its last steps' share would never pass: it is not asked."""
    factor = model.realtime_factor(num_streams, audio_s)
    if not stepping:
        return factor
    return min(factor, model.burst_factor(num_streams, audio_s))


def priority_of(request: Request) -> float:
    """The request's ``priority`` knob (higher is shed later; default 0)."""
    value = request.options.knobs.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"request option priority must be a number, not {value!r}")
    return float(value)


class Admission(Shedding):
    """The supervisor's admission and shedding decisions (trio thread only)."""

    def __init__(
        self,
        max_streams: int,
        realtime_margin: float,
        *,
        headroom: bool,
        client_buffer_s: float = 0.25,
        busy: bool = False,
        warmup_streams: int | None = None,
        cpu: bool = False,
        hold_startups: bool = False,
    ) -> None:
        self.max_streams = max_streams
        self.warmup = Warmup(warmup_streams)
        self.realtime_margin = realtime_margin
        self.client_buffer_s = client_buffer_s
        self.headroom = headroom
        self.busy = busy
        """Admit by each stage's busy fraction (``_utilisation.py``), not its step-time
        model's realtime factor; shed nothing (``admission: busy``)."""
        self.cpu = CpuWatch(usable_cores()) if cpu else None
        """Admit by the cores the stages share (``_cpu.py``); shed nothing
        (``admission: cpu``)."""
        self.hold_startups = hold_startups
        """``admission: cpu`` with a wait (``pipeline.admission_wait_s``): a new stream
        that plays audio waits while another is on its way to its first audio."""
        self.num_refused_headroom = 0
        self.num_shed = 0
        self._lifetimes_s: deque[float] = deque(maxlen=LIFETIMES_KEPT)
        self._mean_audio_s: float | None = None
        self.startup = Startup()
        self._watches: dict[str, BusyWatch] = {}

    @property
    def length_factor(self) -> float:
        """``A / (A + client_buffer_s)`` (1 before any stream completed with audio; ``A``:
        their audio after the first chunk): the realtime factor below which a stream of
        the usual length ends further behind than its client buffers."""
        audio_s = self._mean_audio_s
        return 1.0 if audio_s is None else audio_s / (audio_s + self.client_buffer_s)

    @property
    def needed(self) -> float:
        """The realtime factor admission keeps for every active stream at most (a stage
        may keep less of the margin: ``needed_at``)."""
        return (1.0 + self.realtime_margin) * self.length_factor

    def needed_at(self, model: StepModel, num_streams: int, audio_s: float) -> float:
        """The realtime factor admission keeps at ``model``'s stage for ``num_streams``
        active streams: ``needed`` with the margin that stage keeps (``_margin.py``)."""
        margin = stage_margin(
            model, num_streams, self.realtime_margin, self.client_buffer_s, audio_s
        )
        return (1.0 + margin) * self.length_factor

    def refusal(
        self,
        num_live: int,
        num_open: int,
        models: Iterable[tuple[str, StepModel]],
        audio_s: float,
        num_active: ActiveCounts | None = None,
        oldest_age_s: float | None = None,
        now_s: float | None = None,
        most_lag_s: Callable[[], float] | None = None,
        least_slack_s: Callable[[], float] | None = None,
        num_quiet: int = 0,
        plays_audio: bool = True,
        oldest_start_s: Callable[[], float | None] | None = None,
    ) -> Overloaded | None:
        """Why one more stream must be refused now, or None to admit it. ``num_active``:
        each stage's active streams, by name (default: all ``num_live`` at every stage);
        asked only of a stage that would refuse with all of them charged, and of the
        stages before it (``models`` come in chain order).
        ``oldest_age_s``: how long the oldest live stream has run (the retry hint);
        ``now_s`` (perf_counter s): when, for ``busy`` admission; ``most_lag_s``: the
        largest lag of a live stream (``_guards.py``), asked last; ``least_slack_s``:
        the least time a live stream has to its playback deadline (``admission: cpu``'s
        startup guard); ``num_quiet``: the live streams that play no audio, and
        ``plays_audio``: whether the new one does (``admission: cpu``, ``_cpu.py``);
        ``oldest_start_s``: how long ago the longest-starting live stream that plays audio
        and has none yet was admitted (None: none; ``hold_startups``)."""
        if num_open >= self.max_streams:
            return Overloaded(self.max_streams, self.retry_after_s(num_live, oldest_age_s))
        if num_live == 0:
            return None
        retry_s = self.retry_after_s(num_live, oldest_age_s)
        if self.cpu is not None:  # sampled after each round (``after_round``)
            num_audio = num_live - num_quiet
            problem = self.cpu.problem(num_audio, self.needed, num_quiet, plays_audio)
            if problem is None and least_slack_s is not None:
                startup = self.startup.problem(least_slack_s())
                if startup is None and self.hold_startups and plays_audio and oldest_start_s:
                    startup = self.startup.starting_problem(oldest_start_s())
                if startup is not None:
                    problem, ahead_s = startup
                    retry_s = max(MIN_RETRY_AFTER_S, min(ahead_s, retry_s or math.inf))
        elif self.busy:
            limit = 1.0 / (1.0 + self.realtime_margin)
            problem = busy_problem(self._watches, models, num_live, num_active, limit, now_s)
        elif self.headroom:
            models = list(models)
            problem = self.warmup.problem(models, self.max_streams, audio_s, num_live, now_s)
            problem = problem or self._model_problem(num_live, models, audio_s, num_active)
            if problem is None and most_lag_s is not None:
                problem = lateness_problem(most_lag_s(), self.client_buffer_s)
        else:
            problem = None
        if problem is None:
            return None
        return Overloaded(self.max_streams, retry_s, problem)

    def _model_problem(
        self,
        num_live: int,
        models: Iterable[tuple[str, StepModel]],
        audio_s: float,
        num_active: ActiveCounts | None,
    ) -> str | None:
        """Headroom's refusal by the stages' step-time models (the module's rule),
        ``models`` in chain order: a stage is charged the most streams active at it or
        at any stage before it (those are on their way here; one that will never reach
        it, a text-only answer at the thinker, is charged there too, on the side of
        caution)."""
        names: list[str] = []  # this stage and those before it, in chain order
        most = self.needed  # no stage keeps more: one past it needs no margin of its own
        for name, model in models:
            names.append(name)
            count = num_live + 1
            stepping = num_active is None or active_at(num_active, name, num_live) > 0
            factor = _factor(model, count, audio_s, stepping)
            if factor >= most:
                continue
            needed = self.needed_at(model, count, audio_s)
            if factor < needed and num_active is not None:  # fewer may be active there
                count = 1 + max(active_at(num_active, n, num_live) for n in names)
                factor = _factor(model, count, audio_s, stepping)
                needed = self.needed_at(model, count, audio_s)
            if factor < needed:
                audio = self._mean_audio_s
                asks = "" if audio is None else f" and answers of {audio:.1f} s"
                burst = (
                    " (its last steps' prefills counted)"
                    if model.burst_share > model.first_step_share
                    else ""
                )
                return (
                    f"with {count} active streams stage {name!r} would make {factor:.2f} s of "
                    f"audio per second for each{burst} (pipeline.realtime_margin{asks} ask "
                    f"for {needed:.2f})"
                )
        return None

    def retry_after_s(self, num_live: int, oldest_age_s: float | None = None) -> float | None:
        """When a slot frees (None: nothing measured): how much longer the oldest live
        stream, ``oldest_age_s`` old, runs by the recent completed lifetimes longer than
        that age (their mean excess); without an age, or once it has outlived them all,
        the expected time until one of ``num_live`` streams ends (their mean lifetime
        over ``num_live``)."""
        lifetimes = self._lifetimes_s
        if not lifetimes:
            return None
        estimate = sum(lifetimes) / len(lifetimes) / max(num_live, 1)
        if oldest_age_s is not None:
            longer = [life - oldest_age_s for life in self._lifetimes_s if life > oldest_age_s]
            if longer:
                estimate = sum(longer) / len(longer)
        return min(max(estimate, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)

    def completed(
        self,
        lifetime_s: float,
        audio_s: float = 0.0,
        first_chunk_s: float = 0.0,
        startup_s: float | None = None,
    ) -> None:
        """A stream completed after ``lifetime_s`` with ``audio_s`` of audio, the first
        ``first_chunk_s`` of it in its first chunk, ``startup_s`` after its admission."""
        self.warmup.over = True
        if startup_s is not None:
            self.startup.completed(startup_s, audio_s)
        self._lifetimes_s.append(lifetime_s)
        played_s = audio_s - first_chunk_s  # made while its client played
        if played_s > 0:
            audio = self._mean_audio_s
            self._mean_audio_s = (
                played_s if audio is None else audio * AUDIO_KEEP + played_s * (1 - AUDIO_KEEP)
            )

    def after_round(
        self,
        stage: str,
        model: StepModel,
        num_held: int,
        active_streams: Callable[[float, float], list[StreamState]],
        audio_s: float,
        *,
        now_s: float,
        busy_s: float,
        num_late: int,
        num_audio: int = 0,
        num_quiet: int = 0,
    ) -> None:
        """``stage`` applied a round at ``now_s`` (it holds ``num_held`` streams;
        ``active_streams(now_s, ACTIVE_WINDOW_S)`` lists its active ones): if its factor
        for its active streams has stayed below the shedding threshold, it is busy and
        streams there are past their playback deadlines, shed the active streams beyond
        what it keeps (``should_shed``; shedding a stream idle or finished here would not
        help it). ``busy`` admission: only the stage's busy fraction is kept; ``cpu``:
        only the process's CPU time (``num_audio`` and ``num_quiet``: the live streams
        that play audio and that play none)."""
        if self.cpu is not None:
            self.cpu.update(now_s, process_cpu_s(), audio_s, num_audio, num_quiet)
            return
        if self.busy:
            self._watch(stage, now_s, busy_s)
            return
        num_active = num_held  # at most: not behind with all, not with fewer
        active: list[StreamState] | None = None
        if self.behind(model, num_active, audio_s):
            active = active_streams(now_s, ACTIVE_WINDOW_S)
            num_active = len(active)
        if self.should_shed(
            stage, model, num_active, audio_s, now_s=now_s, busy_s=busy_s, num_late=num_late
        ):
            assert active is not None  # should_shed is only true when behind
            self.shed(stage, model, active, audio_s, now_s)
