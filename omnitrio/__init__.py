"""omnitrio: an actor-model runtime on trio for streaming speech and omni pipelines."""

from ._config import DEFAULT_CLIENT_CAPACITY as DEFAULT_CLIENT_CAPACITY
from ._config import DEFAULT_EDGE_CAPACITY as DEFAULT_EDGE_CAPACITY
from ._config import EdgeSpec as EdgeSpec
from ._config import PipelineConfig as PipelineConfig
from ._config import PipelineSection as PipelineSection
from ._config import StageSpec as StageSpec
from ._config import load_config as load_config
from ._config import parse_config as parse_config
from ._config import resolve_impl as resolve_impl
from ._errors import ConfigError as ConfigError
from ._errors import OmnitrioError as OmnitrioError
from ._errors import Overloaded as Overloaded
from ._errors import PipelineClosed as PipelineClosed
from ._errors import StageError as StageError
from ._errors import StageLoadError as StageLoadError
from ._errors import StreamShed as StreamShed
from ._heap import trim_heap as trim_heap
from ._items import AudioChunk as AudioChunk
from ._items import AudioInput as AudioInput
from ._items import Event as Event
from ._items import Request as Request
from ._items import TextDelta as TextDelta
from ._items import VisibleItem as VisibleItem
from ._options import ResponseOptions as ResponseOptions
from ._options import Scalar as Scalar
from ._overrides import with_model_path as with_model_path
from ._pipeline import Pipeline as Pipeline
from ._pipeline import open_pipeline as open_pipeline
from ._resample import StreamResampler as StreamResampler
from ._resample import resample_float as resample_float
from ._resample import resample_pcm16 as resample_pcm16
from ._stage import Stage as Stage
from ._stage import StepLimits as StepLimits
from ._stage import StreamOutput as StreamOutput
from ._stage import StreamWork as StreamWork
from ._statistics import PipelineStatistics as PipelineStatistics
from ._statistics import StageStatistics as StageStatistics
from ._statistics import StreamStatistics as StreamStatistics
from ._stream import Stream as Stream
from .admission import StepCost as StepCost

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CLIENT_CAPACITY",
    "DEFAULT_EDGE_CAPACITY",
    "AudioChunk",
    "AudioInput",
    "ConfigError",
    "EdgeSpec",
    "Event",
    "OmnitrioError",
    "Overloaded",
    "Pipeline",
    "PipelineClosed",
    "PipelineConfig",
    "PipelineSection",
    "PipelineStatistics",
    "Request",
    "ResponseOptions",
    "Scalar",
    "Stage",
    "StageError",
    "StageLoadError",
    "StageSpec",
    "StageStatistics",
    "StepCost",
    "StepLimits",
    "Stream",
    "StreamOutput",
    "StreamResampler",
    "StreamShed",
    "StreamStatistics",
    "StreamWork",
    "TextDelta",
    "VisibleItem",
    "load_config",
    "open_pipeline",
    "parse_config",
    "resample_float",
    "resample_pcm16",
    "resolve_impl",
    "trim_heap",
    "with_model_path",
]
