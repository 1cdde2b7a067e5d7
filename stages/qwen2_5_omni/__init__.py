"""Qwen2.5-Omni as omnitrio stages: thinker -> talker -> token2wav (DiT + BigVGAN).

Built on transformers' ``Qwen2_5Omni*`` classes. Each stage loads its own folder
of a checkpoint (``checkpoint/thinker``, ``checkpoint/talker``,
``checkpoint/token2wav``); ``make_tiny_checkpoint`` writes a tiny random-init one.
"""

from ._loading import StageWeightsError as StageWeightsError
from ._payloads import CodecCodes as CodecCodes
from ._payloads import ReplyEnd as ReplyEnd
from ._payloads import ReplyStart as ReplyStart
from ._payloads import ReplyToken as ReplyToken
from ._prompt import build_prompt as build_prompt
from ._talker import CODES_EVENT as CODES_EVENT
from ._talker import TalkerStage as TalkerStage
from ._thinker import TEXT_IDS_EVENT as TEXT_IDS_EVENT
from ._thinker import ThinkerStage as ThinkerStage
from ._tiny import make_tiny_checkpoint as make_tiny_checkpoint
from ._token2wav import Token2WavStage as Token2WavStage
from ._token2wav import to_pcm16 as to_pcm16

__all__ = [
    "CODES_EVENT",
    "TEXT_IDS_EVENT",
    "CodecCodes",
    "ReplyEnd",
    "ReplyStart",
    "ReplyToken",
    "StageWeightsError",
    "TalkerStage",
    "ThinkerStage",
    "Token2WavStage",
    "build_prompt",
    "make_tiny_checkpoint",
    "to_pcm16",
]
