"""``omnitrio bench``: streaming metrics, concurrency sweeps and side-by-side baselines.

The metric functions (the names below) are pure and work on
request timelines; the rest drives targets (the in-process pipeline, a server,
the baselines) and writes the reports. Nothing here imports torch.
"""

from ._aggregate import Aggregates as Aggregates
from ._aggregate import aggregate as aggregate
from ._arrivals import arrival_offsets_s as arrival_offsets_s
from ._metrics import CONTINUITY_THRESHOLD_S as CONTINUITY_THRESHOLD_S
from ._metrics import RequestMetrics as RequestMetrics
from ._metrics import Summary as Summary
from ._metrics import percentile as percentile
from ._metrics import request_metrics as request_metrics
from ._metrics import summarize as summarize
from ._metrics import ttfa_by_wave as ttfa_by_wave
from ._metrics import wave_of as wave_of
from ._metrics import waves_by_send_time as waves_by_send_time
from ._metrics import worst_underrun_s as worst_underrun_s
from ._record import AudioArrival as AudioArrival
from ._record import RequestRecord as RequestRecord

__all__ = [
    "CONTINUITY_THRESHOLD_S",
    "Aggregates",
    "AudioArrival",
    "RequestMetrics",
    "RequestRecord",
    "Summary",
    "aggregate",
    "arrival_offsets_s",
    "percentile",
    "request_metrics",
    "summarize",
    "ttfa_by_wave",
    "wave_of",
    "waves_by_send_time",
    "worst_underrun_s",
]
