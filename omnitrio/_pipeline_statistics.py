"""What a running pipeline shows of itself: ``statistics()``, a frozen snapshot of every
stage and stream, and ``occupancy()``, the few counts a sampler reads often. ``Pipeline``
(``_pipeline.py``) has them from ``ShownPipeline``, which reads its state and changes
none of it."""

from __future__ import annotations

from types import MappingProxyType

from ._actor import StageActor, stage_statistics
from ._config import PipelineConfig
from ._pipeline_start import max_trio_stall_s
from ._statistics import Occupancy, PipelineStatistics
from ._stream import DeliveryCounters, StreamState
from .admission import Admission, AdmissionQueue


class ShownPipeline:
    """``Pipeline``'s statistics; the state they read is the pipeline's (``__init__``)."""

    config: PipelineConfig
    _actors: list[StageActor]
    _side: StageActor | None
    _streams: dict[str, StreamState]
    _num_admitted: int
    _num_refused: int
    _outcomes: dict[str, int]
    _delivery: DeliveryCounters
    _admission: Admission
    _queue: AdmissionQueue

    def statistics(self) -> PipelineStatistics:
        """A frozen snapshot of every stage and stream. Never blocks, but works out every
        stage's admission model and every stream's links on the trio thread (a
        millisecond or more at 64 streams): a sampler that needs only the counts asks
        ``occupancy()``."""
        actors = self._actors
        audio_s = self._delivery.audio_s_put
        cap = self.config.pipeline.max_streams
        needed = self._admission.needed_at  # what admission asks: realtime_streams counts at it
        stages = stage_statistics({a.name: a for a in actors}, audio_s, cap, needed)
        return PipelineStatistics(
            stages=stages,
            streams=MappingProxyType({s.id: s.statistics() for s in self._streams.values()}),
            num_open_streams=len(self._streams),
            max_streams=self.config.pipeline.max_streams,
            num_admitted=self._num_admitted,
            num_refused=self._num_refused,
            num_refused_headroom=self._admission.num_refused_headroom,
            num_shed=self._admission.num_shed,
            audio_s_delivered=audio_s,
            num_completed=self._outcomes["completed"],
            num_failed=self._outcomes["failed"],
            num_cancelled=self._outcomes["cancelled"],
            num_payloads_routed=sum(a.counters.num_payloads_sent for a in actors),
            num_payload_bytes_relayed=sum(s.num_payload_bytes_relayed for s in stages.values()),
            num_items_delivered=self._delivery.num_delivered,
            num_payloads_to_client=self._delivery.num_non_visible_seen,
            side_stage=None if self._side is None else self._side.statistics(),
            max_trio_stall_s=max_trio_stall_s(),
            admission_waits=self._queue.statistics(),
        )

    def occupancy(self) -> Occupancy:
        """Open streams, and each stage's waiting payloads and latest batch: the counts
        ``omnitrio bench`` samples every 0.1 s during a run. Far cheaper than
        ``statistics()``, which works out every stage's model and every stream's links
        on the trio thread (the run's own clients and stages wait meanwhile)."""
        actors = self._actors
        depth = {
            a.name: sum(
                (s.in_link.buffered if s.in_link else 0) + len(s.carry) for s in a.slots.values()
            )
            for a in actors
        }
        batch = {a.name: a.counters.last_batch_size for a in actors}
        return Occupancy(len(self._streams), MappingProxyType(depth), MappingProxyType(batch))
