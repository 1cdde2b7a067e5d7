"""Qwen3-Omni code2wav stage: codec frames in, PCM audio chunks out.

Frames are decoded in windows as they arrive: a small first window for a fast
first packet (``first_chunk_frames``), then ``chunk_frames`` at a time, each with
up to ``left_context_frames`` earlier frames as context whose samples are cut
off — what the reference ``chunked_decode`` does, with a configurable first
window. The frames left when the talker finishes are decoded as a last window.
Windows of several streams that are due together are decoded one stream at a
time (their lengths differ); the model is small next to the two AR stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import Qwen3OmniMoeCode2Wav

from omnitrio import AudioChunk, Request, StreamOutput, StreamWork
from stages.kit import on, stage_device

from .payloads import CodecFrame
from .weights import ModelSource

SAMPLE_RATE_HZ = 24_000


@dataclass
class _Stream:
    frames: list[torch.Tensor] = field(default_factory=list)  # each [G]
    decoded: int = 0  # frames already turned into audio
    num_samples: int = 0


class Qwen3OmniCode2Wav:
    checkpoint = "qwen3-omni"  # model_path: one folder shared with the family's other stages
    max_inputs_per_step = None
    max_payloads_per_step = 0
    max_visible_per_step = 1

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str | None = None,
        live_model: str | None = None,
        chunk_frames: int = 25,
        first_chunk_frames: int = 4,
        left_context_frames: int = 25,
        num_threads: int | None = None,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if min(chunk_frames, first_chunk_frames) < 1 or left_context_frames < 0:
            raise ValueError(
                "chunk_frames and first_chunk_frames must be >= 1 and left_context_frames >= 0"
            )
        self.name = name
        self.device = stage_device(name, device)
        source = ModelSource(name, self.device, model_path, live_model)
        self.model = source.module("code2wav", Qwen3OmniMoeCode2Wav)
        self.samples_per_frame = int(self.model.total_upsample)
        self.chunk_frames = chunk_frames
        self.first_chunk_frames = first_chunk_frames
        self.left_context_frames = left_context_frames
        self.streams: dict[str, _Stream] = {}
        self.num_windows = 0

    def open_stream(self, stream_id: str, request: Request) -> None:
        self.streams[stream_id] = _Stream()

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        outputs = {}
        for work in batch:
            stream = self.streams[work.stream_id]
            stream.frames += [item.codes for item in work.inputs if isinstance(item, CodecFrame)]
            outputs[work.stream_id] = self._advance(stream, work.input_closed)
        return outputs

    def close_stream(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    def close(self) -> None:
        pass

    def stage_statistics(self) -> Mapping[str, float]:
        return {"num_active_streams": len(self.streams), "num_windows": self.num_windows}

    def _advance(self, stream: _Stream, input_closed: bool) -> StreamOutput:
        """Decode the next window if it is due; ``more`` while another one is."""
        window = self.first_chunk_frames if stream.decoded == 0 else self.chunk_frames
        pending = len(stream.frames) - stream.decoded
        if pending < window and not (input_closed and pending > 0):
            return StreamOutput(done=input_closed and pending == 0)
        end = stream.decoded + min(window, pending)
        audio = self._decode(stream, end)
        pending = len(stream.frames) - stream.decoded
        next_window = self.chunk_frames
        return StreamOutput(
            visible=(audio,),
            more=pending >= next_window or (input_closed and pending > 0),
            done=input_closed and pending == 0,
        )

    def _decode(self, stream: _Stream, end: int) -> AudioChunk:
        wav = decode_window(
            self.model, stream.frames, stream.decoded, end, self.left_context_frames
        )
        stream.decoded = end
        stream.num_samples += wav.shape[0]
        self.num_windows += 1
        # The user-visible end of the pipeline: the one host copy of the audio.
        pcm = (wav.float().clamp(-1, 1) * 32767).round().to(torch.int16).cpu().numpy()
        return AudioChunk(pcm.astype("<i2").tobytes(), SAMPLE_RATE_HZ)


def decode_window(
    model: Qwen3OmniMoeCode2Wav, frames: list[torch.Tensor], start: int, end: int, context: int
) -> torch.Tensor:
    """Samples of ``frames[start:end]`` (each [G]), decoded with up to ``context`` frames
    of left context whose samples are cut off. Returns float [samples]."""
    context = min(context, start)
    codes = torch.stack(frames[start - context : end], dim=1)[None]  # [1, G, T]
    with torch.no_grad():
        wav = model(on(codes, model.device))  # [1, 1, T * samples_per_frame - lost]
    return wav[0, 0, context * int(model.total_upsample) :]
