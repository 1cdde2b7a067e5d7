"""A last stage for tests: shows each codec frame the talker sends as an event."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from omnitrio import Event, Request, StreamOutput, StreamWork
from stages.qwen3_omni.payloads import CodecFrame


class CodecRecorder:
    max_inputs_per_step: int | None = 8
    max_payloads_per_step = 0
    max_visible_per_step = 8

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.name = name

    def open_stream(self, stream_id: str, request: Request) -> None:
        pass

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        return {
            work.stream_id: StreamOutput(
                visible=tuple(
                    Event("codec_frame", {"codes": tuple(int(c) for c in item.codes)})
                    for item in work.inputs
                    if isinstance(item, CodecFrame)
                ),
                done=work.input_closed,
            )
            for work in batch
        }

    def close_stream(self, stream_id: str) -> None:
        pass

    def close(self) -> None:
        pass
