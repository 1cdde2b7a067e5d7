"""The stage kit: what a model stage's author uses, in one public module.

A stage is any class with the ``omnitrio.Stage`` shape (``open_stream``,
``step``, ``close_stream``, ``close``) constructed as ``Stage(name, device, *,
params...)`` from a config's ``impl``/``device``/``params``; a thread-count param
is called ``num_threads`` where a stage has one, and a model's folder ``model_path``.
Stages that read parts of one checkpoint folder (a model family's thinker, talker
and vocoder) say so with a class attribute, ``checkpoint = "<family>"``: then
``omnitrio run --model-path DIR`` gives them all ``DIR``; stages that each take a
model of their own leave it out, and the flag names them (``--model-path STAGE=PATH``).
What this module gives it:

- ``AutoregressiveStage``: the base of an autoregressive model stage (device,
  ``num_threads``, per-stream state in ``streams``, ``clock``, ``packager``, statistics),
  and ``per_stream`` / ``failed``: an error in one stream's own work (``STREAM_ERRORS``:
  ``GrammarError``, ``SamplingError``, ``OptionError``) fails that stream alone.
- ``Packager``, ``Piece``, ``Outbox``, ``step_output``, ``PackagingError``,
  ``Detokenizer``: packaging off the critical path (detokenizing, slicing hidden
  states) on one thread per stage, collected by the stream's next step.
- ``KVSlots``, ``SlotKV``: a stage's KV cache kept batched, one slot per stream
  written in place (``AutoregressiveStage.kv_slots``): a decode step gathers nothing.
- ``batched_decode``, ``cache_length``, ``cache_nbytes``: one decode forward for
  every stream of a step, each with its own ``DynamicCache`` (the voice LLM's path).
- ``SamplingParams``, ``Sampler``, ``OptionError``, ``SamplingError``: per-stream
  sampling from request options (greedy by default), with transformers' own logits
  processors.
- ``load_pretrained``, ``WeightsError``: loading a local checkpoint folder, refusing
  missing or mismatched weights; ``load_embedding``: one weight of it, without the model.
- ``VllmEngine`` (``EngineOutput``, ``VllmUnavailable``, ``VllmEngineError``,
  ``VllmRequestError``): vLLM's ``LLMEngine`` as a stage's engine, in a process and
  environment of its own (``engine: vllm``; ``scripts/setup vllm``); ``VllmEngineStage``:
  what a stage on it shares (add with sampling params, abort on close, statistics);
  ``one_placeholder``, ``check_prompt_rows``: an audio prompt given to its processor.
- ``StepClock``: forward, sampling and packaging time per step.
- ``constructor_signature``: the params a stage class whose ``engine`` param picks the
  class (a ``__new__``) shows to ``inspect.signature``, as its ``__signature__``.
- ``stage_device``, ``DeviceError``: the stage's torch device, refused with the stage's
  name when it is unknown or absent (``cuda`` without a GPU); ``on``: a tensor on a
  device, not copied when it is already there.
- ``tool_call_grammar``, ``Grammar``, ``Vocabulary``: JSON-schema-constrained tool
  calls, a ``Sampler`` constraint (the tools, their markers and their rules are
  omnitrio's: ``omnitrio.tools.FunctionTool``, ``TOOL_CALL_OPEN``, ``check_tools`` ...).
- ``build_byte_tokenizer``, ``byte_symbols``, ``NUM_BYTE_TOKENS``: the byte-level
  tokenizer of a family's tiny random-init checkpoint (``tiny.py``);
  ``write_processor_config``: its multimodal processor's config (vLLM's audio input).

The implementations live in the private ``stages._*`` modules; import them from here.
A family's modules import only this kit, ``omnitrio``'s public names and each other
(``tests/test_layout.py`` holds it).
"""

from stages._grammar import Grammar as Grammar
from stages._grammar import GrammarError as GrammarError
from stages._grammar import Vocabulary as Vocabulary
from stages._grammar import tool_call_grammar as tool_call_grammar
from stages._packaging import Detokenizer as Detokenizer
from stages._packaging import Outbox as Outbox
from stages._packaging import Packager as Packager
from stages._packaging import PackagingError as PackagingError
from stages._packaging import Piece as Piece
from stages._packaging import step_output as step_output
from stages._tiny_tokenizer import NUM_BYTE_TOKENS as NUM_BYTE_TOKENS
from stages._tiny_tokenizer import build_byte_tokenizer as build_byte_tokenizer
from stages._tiny_tokenizer import byte_symbols as byte_symbols
from stages._tiny_tokenizer import write_processor_config as write_processor_config
from stages._torch_device import DeviceError as DeviceError
from stages._torch_device import on as on
from stages._torch_device import stage_device as stage_device
from stages._torch_kv import batched_decode as batched_decode
from stages._torch_kv import cache_length as cache_length
from stages._torch_kv import cache_nbytes as cache_nbytes
from stages._torch_loading import WeightsError as WeightsError
from stages._torch_loading import copy_file as copy_file
from stages._torch_loading import keep_composite_files as keep_composite_files
from stages._torch_loading import load_embedding as load_embedding
from stages._torch_loading import load_pretrained as load_pretrained
from stages._torch_sampling import OptionError as OptionError
from stages._torch_sampling import Sampler as Sampler
from stages._torch_sampling import SamplingError as SamplingError
from stages._torch_sampling import SamplingParams as SamplingParams
from stages._torch_slots import KVSlots as KVSlots
from stages._torch_slots import SlotKV as SlotKV
from stages._torch_stage import STREAM_ERRORS as STREAM_ERRORS
from stages._torch_stage import AutoregressiveStage as AutoregressiveStage
from stages._torch_stage import constructor_signature as constructor_signature
from stages._torch_timing import StepClock as StepClock
from stages._vllm_engine import EngineOutput as EngineOutput
from stages._vllm_engine import VllmEngine as VllmEngine
from stages._vllm_engine import VllmEngineError as VllmEngineError
from stages._vllm_engine import VllmRequestError as VllmRequestError
from stages._vllm_engine import VllmUnavailable as VllmUnavailable
from stages._vllm_stage import VllmEngineStage as VllmEngineStage
from stages._vllm_stage import check_prompt_rows as check_prompt_rows
from stages._vllm_stage import one_placeholder as one_placeholder

__all__ = [
    "NUM_BYTE_TOKENS",
    "STREAM_ERRORS",
    "AutoregressiveStage",
    "Detokenizer",
    "DeviceError",
    "EngineOutput",
    "Grammar",
    "GrammarError",
    "KVSlots",
    "OptionError",
    "Outbox",
    "Packager",
    "PackagingError",
    "Piece",
    "Sampler",
    "SamplingError",
    "SamplingParams",
    "SlotKV",
    "StepClock",
    "VllmEngine",
    "VllmEngineError",
    "VllmEngineStage",
    "VllmRequestError",
    "VllmUnavailable",
    "Vocabulary",
    "WeightsError",
    "batched_decode",
    "build_byte_tokenizer",
    "byte_symbols",
    "cache_length",
    "cache_nbytes",
    "check_prompt_rows",
    "constructor_signature",
    "load_embedding",
    "load_pretrained",
    "on",
    "one_placeholder",
    "stage_device",
    "step_output",
    "tool_call_grammar",
    "write_processor_config",
]
