"""The sglang-omni pipeline of the synthetic stages, laid out as the package lays out
Qwen3-Omni's speech pipeline (``models/qwen3_omni/config.py``: ``speech_stages`` with
``SPEECH_DEFAULT_PROCESSES``, one process per stage):

    preprocessing -> thinker  --stream--> decode (terminal)
                  \\          \\-stream--> talker_ar --stream--> code2wav (terminal)
                   \\-> talker_ar (its payload, as the encoders send it)

The image and audio encoders are left out (the synthetic requests carry text only).
"""

from __future__ import annotations

from typing import Any

from sglang_omni.config.schema import FactoryArgs, PipelineConfig, StageConfig

PKG = "sglang_omni_synthetic"


class SyntheticOmniPipelineConfig(PipelineConfig):
    """Two terminal stages: the text (decode) and the audio (code2wav)."""


def build_config(spec: dict[str, Any]) -> SyntheticOmniPipelineConfig:
    """The pipeline for ``spec``: each stage's factory arguments (see ``driver.py``)."""
    return SyntheticOmniPipelineConfig(
        model_path="synthetic",
        name="synthetic-omni",
        entry_stage="preprocessing",
        stages=[
            StageConfig(
                name="preprocessing",
                process="preprocessing",
                factory_path=f"{PKG}.thinker.create_preprocessing",
                next=["thinker", "talker_ar"],
            ),
            StageConfig(
                name="thinker",
                process="thinker",
                factory_path=f"{PKG}.thinker.create_thinker",
                factory=FactoryArgs(**spec["thinker"]),
                next="decode",
                stream_to=["talker_ar", "decode"],
            ),
            StageConfig(
                name="decode",
                process="decode",
                factory_path=f"{PKG}.decode.create_decode",
                terminal=True,
                can_accept_stream_before_payload=True,
            ),
            StageConfig(
                name="talker_ar",
                process="talker_ar",
                factory_path=f"{PKG}.talker.create_talker",
                factory=FactoryArgs(**spec["talker"]),
                next="code2wav",
                stream_to=["code2wav"],
                can_accept_stream_before_payload=True,
            ),
            StageConfig(
                name="code2wav",
                process="code2wav",
                factory_path=f"{PKG}.code2wav.create_code2wav",
                factory=FactoryArgs(**spec["code2wav"]),
                terminal=True,
                can_accept_stream_before_payload=True,
            ),
        ],
    )
