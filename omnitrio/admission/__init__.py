"""Admission and headroom, one room: whether a new stream is admitted, when admitted
streams are shed, and the per-stage step-time model both decide by.

The pipeline's one entry point is ``Admission`` (``refusal`` before a stream is
admitted, ``after_round`` after a stage applied a round, ``completed`` when a stream
ends), and ``AdmissionQueue`` before it, where a request the rule turns away may wait
(``pipeline.admission_wait_s``); each stage actor feeds its own ``StepModel``.
``docs/design.md``, "Admission".
"""

from ._cpu import plays_audio as plays_audio
from ._headroom import Factor as Factor
from ._headroom import StepModel as StepModel
from ._headroom import StepPrior as StepPrior
from ._live import LiveStreams as LiveStreams
from ._prior import StepCost as StepCost
from ._prior import declared_priors as declared_priors
from ._rule import ACTIVE_WINDOW_S as ACTIVE_WINDOW_S
from ._rule import Admission as Admission
from ._rule import priority_of as priority_of
from ._wait import AdmissionQueue as AdmissionQueue
from ._yield import StreamFlow as StreamFlow

__all__ = [
    "ACTIVE_WINDOW_S",
    "Admission",
    "AdmissionQueue",
    "LiveStreams",
    "StepCost",
    "StepModel",
    "StepPrior",
    "StreamFlow",
    "declared_priors",
    "plays_audio",
    "priority_of",
]
