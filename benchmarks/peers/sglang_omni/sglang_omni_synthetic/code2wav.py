"""code2wav, on sglang-omni's ``StreamingVocoderBase``, shaped as the package's own.

The package's Qwen3-Omni code2wav (``models/qwen3_omni/components/code2wav_scheduler.py:
Code2WavScheduler``) is a ``StreamingVocoderBase`` that does not batch chunks on arrival
(``can_batch_stream_chunks`` stays False): a chunk only joins its request's state
(``decode_and_emit`` sends nothing), and the serving loop, once it has drained every
queued message, runs a ready step (``has_ready_work`` / ``run_ready_step``) that decodes
*the ready windows of one length in one replay*: first windows ahead of later ones, the
oldest ready first, at most ``max_replay_rows`` rows (``ready_window_group``). A finished
stream's remaining windows decode alone, then its remainder (``finish_windows``,
``decode_delta``). This class keeps that policy with the synthetic step model in place
of the codec: a window of ``window`` frames is one unit of the workload, each decode
costs the profile's step for its rows and emits ``audio_samples`` of audio.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from sglang_omni.proto.request import StagePayload
from sglang_omni.scheduling.message import OutgoingMessage
from sglang_omni.scheduling.streaming_vocoder import StreamingVocoderBase

from .cost import StepModel, StepTrace, TracedStage


@dataclass
class WindowState:
    frames: int = 0
    emitted: int = 0  # frames decoded
    windows: int = 0
    ready_since: float | None = None


class SyntheticCode2Wav(TracedStage, StreamingVocoderBase[WindowState, None]):
    def __init__(
        self, model: StepModel, window: int, max_replay_rows: int, samples: int, rate: int
    ):
        super().__init__(None, sample_rate=rate, stream_source_hint="synthetic code2wav")
        self.model = model
        self.window = max(1, window)
        self.max_replay_rows = max(1, max_replay_rows)
        self.samples = samples
        self.trace = StepTrace("code2wav")

    def create_stream_state(self, request_id: str) -> WindowState:
        del request_id
        return WindowState()

    def validate_chunk(
        self, request_id: str, state: WindowState, codes: torch.Tensor
    ) -> torch.Tensor:
        del request_id, state
        return codes

    def ingest(self, request_id: str, state: WindowState, codes: torch.Tensor) -> None:
        del request_id
        state.frames += int(codes.shape[0]) if codes.ndim == 2 else 1

    def decode_and_emit(self, request_id: str, state: WindowState) -> list[OutgoingMessage]:
        del request_id, state
        return []  # windows decode in the ready steps

    def window_ready(self, state: WindowState) -> bool:
        return state.frames - state.emitted >= self.window

    def ready_streams(self) -> list[tuple[str, WindowState]]:
        now = time.monotonic()
        streams = []
        for request_id, state in self.stream_state_items():
            if not self.is_aborted(request_id) and self.window_ready(state):
                if state.ready_since is None:
                    state.ready_since = now
                streams.append((request_id, state))
        return streams

    def has_ready_work(self) -> bool:
        with self.state_lock:
            return bool(self.ready_streams())

    def ready_window_group(self) -> list[tuple[str, WindowState]]:
        streams = self.ready_streams()
        if not streams:
            return []
        anchor = min(streams, key=lambda s: (s[1].emitted > 0, s[1].ready_since))
        follows = anchor[1].emitted > 0
        group = sorted(
            (s for s in streams if (s[1].emitted > 0) == follows),
            key=lambda s: s[1].ready_since or 0.0,
        )
        return group[: self.max_replay_rows]

    def decode_windows(self, participants: list[tuple[str, WindowState]]) -> list[OutgoingMessage]:
        kind = "later" if participants[0][1].emitted else "first"
        self.trace.step(self.model, kind, len(participants))
        messages = []
        for request_id, state in participants:
            state.emitted += self.window
            state.windows += 1
            state.ready_since = None
            self.mark_stream_emitted(request_id)
            messages.append(self.stream_chunk_message(request_id, self.audio()))
        return messages

    def run_ready_step(self) -> None:
        with self.state_lock:
            participants = self.ready_window_group()
            if participants:
                for message in self.decode_windows(participants):
                    if not self.is_aborted(message.request_id):
                        self.outbox.put(message)

    def audio(self) -> torch.Tensor:
        return torch.zeros(self.samples, dtype=torch.float32)

    def finish_windows(self, request_id: str) -> list[OutgoingMessage]:
        messages: list[OutgoingMessage] = []
        state = self.stream_states.get(request_id)
        while state is not None and self.window_ready(state):
            messages.extend(self.decode_windows([(request_id, state)]))
        return messages

    def decode_delta(
        self, request_id: str, state: WindowState, *, is_final: bool
    ) -> torch.Tensor | None:
        del request_id, is_final
        if state.frames <= state.emitted:
            return None
        self.trace.step(self.model, "final", 1)
        state.emitted = state.frames
        state.windows += 1
        return self.audio()

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        messages = self.finish_windows(request_id)
        messages.extend(super().on_stream_done(request_id) or [])
        return messages

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        messages = self.finish_windows(request_id)
        state = self.stream_states.get(request_id)
        if state is not None:
            waveform = self.decode_delta(request_id, state, is_final=True)
            if waveform is not None:
                self.mark_stream_emitted(request_id)
                messages.append(self.stream_chunk_message(request_id, waveform))
        return messages

    def final_result_data(
        self, request_id: str, payload: StagePayload, state: WindowState
    ) -> Mapping[str, object]:
        del request_id, payload
        return {"windows": state.windows, "modality": "audio"}


def create_code2wav(
    model_path: str = "",
    *,
    step: dict[str, float],
    window: int,
    max_replay_rows: int,
    audio_samples: int,
    sample_rate_hz: int,
) -> SyntheticCode2Wav:
    del model_path
    return SyntheticCode2Wav(
        StepModel.from_spec(step), window, max_replay_rows, audio_samples, sample_rate_hz
    )
