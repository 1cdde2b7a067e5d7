"""omnitrio: an actor-model runtime on trio for streaming speech and omni pipelines."""

from ._config import DEFAULT_CLIENT_CAPACITY as DEFAULT_CLIENT_CAPACITY
from ._config import DEFAULT_EDGE_CAPACITY as DEFAULT_EDGE_CAPACITY
from ._config import EdgeSpec as EdgeSpec
from ._config import PipelineConfig as PipelineConfig
from ._config import PipelineSection as PipelineSection
from ._config import StageSpec as StageSpec
from ._config import load_config as load_config
from ._config import parse_config as parse_config
from ._errors import ConfigError as ConfigError
from ._errors import OmnitrioError as OmnitrioError
from ._errors import Overloaded as Overloaded
from ._errors import PipelineClosed as PipelineClosed
from ._errors import StageError as StageError
from ._errors import StageLoadError as StageLoadError
from ._items import AudioChunk as AudioChunk
from ._items import AudioInput as AudioInput
from ._items import Event as Event
from ._items import Request as Request
from ._items import TextDelta as TextDelta
from ._items import VisibleItem as VisibleItem
from ._pipeline import Pipeline as Pipeline
from ._pipeline import open_pipeline as open_pipeline
from ._resample import StreamResampler as StreamResampler
from ._resample import resample_float as resample_float
from ._resample import resample_pcm16 as resample_pcm16
from ._stage import Stage as Stage
from ._stage import StreamOutput as StreamOutput
from ._stage import StreamWork as StreamWork
from ._statistics import PipelineStatistics as PipelineStatistics
from ._statistics import StageStatistics as StageStatistics
from ._statistics import StreamStatistics as StreamStatistics
from ._stream import Stream as Stream
from ._tools import FINISH_EVENT as FINISH_EVENT
from ._tools import TOOL_CALL_CLOSE as TOOL_CALL_CLOSE
from ._tools import TOOL_CALL_OPEN as TOOL_CALL_OPEN
from ._tools import TOOL_EVENTS as TOOL_EVENTS
from ._tools import FunctionTool as FunctionTool
from ._tools import ToolChoice as ToolChoice
from ._tools import ToolError as ToolError
from ._tools import arguments_json as arguments_json
from ._tools import call_text as call_text
from ._tools import check_tool_choice as check_tool_choice
from ._tools import check_tools as check_tools
from ._tools import parse_tool_options as parse_tool_options
from ._tools import tool_call_lark as tool_call_lark
from ._tools import tool_options as tool_options

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CLIENT_CAPACITY",
    "DEFAULT_EDGE_CAPACITY",
    "FINISH_EVENT",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_EVENTS",
    "AudioChunk",
    "AudioInput",
    "ConfigError",
    "EdgeSpec",
    "Event",
    "FunctionTool",
    "OmnitrioError",
    "Overloaded",
    "Pipeline",
    "PipelineClosed",
    "PipelineConfig",
    "PipelineSection",
    "PipelineStatistics",
    "Request",
    "Stage",
    "StageError",
    "StageLoadError",
    "StageSpec",
    "StageStatistics",
    "Stream",
    "StreamOutput",
    "StreamResampler",
    "StreamStatistics",
    "StreamWork",
    "TextDelta",
    "ToolChoice",
    "ToolError",
    "VisibleItem",
    "arguments_json",
    "call_text",
    "check_tool_choice",
    "check_tools",
    "load_config",
    "open_pipeline",
    "parse_config",
    "parse_tool_options",
    "resample_float",
    "resample_pcm16",
    "tool_call_lark",
    "tool_options",
]
