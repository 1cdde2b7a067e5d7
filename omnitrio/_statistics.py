"""Frozen snapshots of a pipeline's state, for tests, metrics and benchmarks.

Tests assert on these instead of on timing. Counts are ``num_*``; times are
seconds (``*_s``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepModelStatistics:
    """A stage's learned step-time model (``StageStatistics.step_model``)."""

    num_steps: int
    intercept_s: float
    per_stream_s: float
    scale: float
    """Recent steps' time over what steps of their kind took (1.3: 30 % slower than learned)."""
    audio_s_per_stream_step: float
    """Seconds of audio one stream-step at this stage yields (0 before any audio)."""
    realtime_streams: int
    """The most streams this stage keeps in real time now, at the realtime factor
    admission asks (``Admission.needed``: the margin, and answers short enough for the
    client buffer to absorb a factor below 1); 0: no opinion yet."""
    first_step_share: float = 0.0
    """Share of its time spent on streams' first steps beyond a plain step (prefills)."""


@dataclass(frozen=True)
class StageStatistics:
    name: str
    num_open_streams: int
    """Streams this stage holds state for (opened or about to be)."""
    queue_depth: Mapping[str, int]
    """Per stream: payloads waiting on the stage's incoming edge."""
    num_steps: int
    last_batch_size: int
    largest_batch_size: int
    mean_batch_size: float
    num_skipped_no_credit: int
    """Times a stream with work was left out of a batch because a channel was full."""
    num_payloads_sent: int
    num_visible_sent: int
    num_stream_failures: int
    num_step_failures: int
    num_empty_plans: int
    """Wake-ups after which the stage found nothing to do (targeted wake-ups keep it 0
    in a steady run)."""
    busy_s: float
    """Time the worker thread spent in stage calls."""
    trio_s: float
    """Time the trio thread spent planning and applying this stage's turns."""
    idle_s: float
    """Time the actor waited with nothing ready."""
    hung: bool = False
    """The stage is out of service: a step outlived its ``step_timeout_s``, or its Ray
    actor is being restarted after its process died."""
    model: Mapping[str, float] = field(default_factory=dict)
    """The stage's own figures, if it reports any (``stage_statistics()``): e.g. forward,
    sampling and packaging time per step, tokens made, KV bytes in use."""
    num_payload_bytes_relayed: int = 0
    """Bytes of edge payloads copied through the supervisor's process to or from this
    stage's Ray actor. 0 for a thread (nothing is copied) and on an edge between two
    Ray-placed stages (the supervisor routes object references only)."""
    pid: int | None = None
    """The process id of the stage's Ray actor (``placement: ray``); None for a thread."""
    step_model: StepModelStatistics | None = None
    """The stage's step-time model, learned online from its own steps
    (``admission/_headroom.py``): what admission by headroom and shedding decide by."""
    num_behind_deadline: int = 0
    """Ready streams seen by a plan after their playback deadline (summed over plans)."""
    num_active_streams: int = 0
    """Live streams with work here lately (``admission.ACTIVE_WINDOW_S``), or in a round
    out: those admission by headroom charges this stage a step per round for."""
    max_steps_to_first_step: int = 0
    """The most of this stage's steps a stream waited for its first step here, counted
    from when the stage's actor saw its first input, its own step included (steps that
    ended after that): 2 at most on a thread (the step running, then its own) unless
    the newcomer lacked credit or a whole batch of newcomers came at once."""


@dataclass(frozen=True)
class StreamStatistics:
    stream_id: str
    in_flight: Mapping[str, int]
    """Per edge name (``a->b``, and ``client``): items sent and not yet taken."""
    held_by: tuple[str, ...]
    """Stages still holding state for the stream."""
    num_delivered: int


@dataclass(frozen=True)
class Occupancy:
    """What a load generator samples while it runs (``Pipeline.occupancy``): the counts
    of ``PipelineStatistics`` that cost next to nothing to read. No stage's step-time
    model is worked out (``statistics()`` has each find its ``realtime_streams``, a
    millisecond or more on the trio thread at 64 streams) and no stream is snapshotted."""

    num_open_streams: int
    queue_depth: Mapping[str, int]
    """Per stage: payloads waiting on its incoming edge, its streams' together (the sum
    of ``StageStatistics.queue_depth``)."""
    last_batch_size: Mapping[str, int]
    """Per stage: streams in its latest step."""


@dataclass(frozen=True)
class AdmissionWaitStatistics:
    """Requests that waited to be admitted (``pipeline.admission_wait_s``)."""

    num_waiting: int = 0
    """Waiting now."""
    num_admitted: int = 0
    """Waited, then admitted."""
    num_refused: int = 0
    """Waited, then refused (also counted in ``PipelineStatistics.num_refused``)."""
    num_left: int = 0
    """Their caller went away while they waited."""
    wait_s: float = 0.0
    """Seconds waited in all (those waiting now not yet counted)."""
    longest_s: float = 0.0
    """The longest single wait."""


@dataclass(frozen=True)
class PipelineStatistics:
    stages: Mapping[str, StageStatistics]
    streams: Mapping[str, StreamStatistics]
    num_open_streams: int
    max_streams: int
    num_admitted: int
    num_refused: int
    num_completed: int
    num_failed: int
    num_cancelled: int
    num_payloads_routed: int
    """Edge payloads handed from a stage to the next one."""
    num_items_delivered: int
    """User-visible items taken by clients."""
    num_payloads_to_client: int
    """Non-visible objects that reached a client's channel. The data-plane rule keeps it 0."""
    side_stage: StageStatistics | None = None
    """The side stage (the config's ``side_stage``), if there is one."""
    num_payload_bytes_relayed: int = 0
    """Sum of the stages' ``num_payload_bytes_relayed``."""
    num_refused_headroom: int = 0
    """Of ``num_refused``: refused because a stage had no real-time headroom for one
    more stream (the rest: ``max_streams``)."""
    num_shed: int = 0
    """Admitted streams failed with ``StreamShed`` because a stage fell behind real time."""
    audio_s_delivered: float = 0.0
    """Seconds of audio the stages put on clients' links."""
    max_trio_stall_s: float = 0.0
    """The longest single task step on the trio thread while pipelines ran (a collector
    pause counts): the longest time no actor and no client could move."""
    admission_waits: AdmissionWaitStatistics = field(default_factory=AdmissionWaitStatistics)
    """Requests that waited to be admitted (``pipeline.admission_wait_s``)."""
