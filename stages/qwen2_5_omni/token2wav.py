"""token2wav: codec codes -> 24 kHz PCM16, decoded in windows as the codes arrive.

transformers' ``Qwen2_5OmniToken2WavModel`` has no streaming path: it runs the
DiT's ODE (10-step RK4 by default, classifier-free guidance) over the whole code
sequence from one noise tensor, then BigVGAN over the whole mel. Here each window
of codes is decoded the same way with three changes:

- a window is ``first_chunk_frames`` codes, then ``chunk_frames`` codes; it is
  decoded with ``left_context_frames`` codes before it and ``right_context_frames``
  after it (it waits for those, except at the end), and only its own samples are
  kept;
- the ODE's starting noise is cut from one per-stream noise tensor drawn up front
  from the stream's ``seed`` (``torch.randn`` of [1, max_codes * repeats, mel] from
  a generator seeded like ``torch.manual_seed(seed)``), at the window's own
  positions — so a window that spans the whole utterance is exactly the
  reference's decode (CPU ``randn`` fills blocks of 16 values in order, so a
  prefix equals a shorter draw when mel is a multiple of 16);
- windows of equal length (and reference-mel shape) in one step, from any
  streams, are decoded together: one ODE solve and one vocoder call for all.

The DiT's attention reaches one 24-frame block (12 codes) ahead or behind in some
layers and the ODE repeats it at every evaluation, so a window's edges differ from
the whole-utterance decode; context trims that. Lookahead matters most: on the
tiny checkpoint (signal RMS ~0.09 of full scale), windows 12/24 with 24 codes of
left context differ by max ~0.29 / RMS ~0.018 without right context, and by max
~0.02 / RMS ~3e-4 with 12 codes of right context
(tests/stages/qwen2_5_omni/test_qwen2_5_omni_parity.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Qwen2_5OmniToken2WavModel
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from omnitrio import AudioChunk, Request, StepLimits, StreamOutput, StreamWork
from stages.kit import stage_device

from .loading import load_speakers, load_stage_model, speaker_of, stage_folder
from .payloads import CodecCodes

MAX_WINDOWS_PER_STEP = 2


@dataclass
class _Stream:
    noise: torch.Tensor  # [1, max_codes * repeats, mel]
    conditioning: torch.Tensor  # [1, enc_emb_dim]
    reference_mel: torch.Tensor  # [1, T, mel]
    codes: list[int] = field(default_factory=list)
    num_emitted: int = 0  # codes whose audio was sent


class Qwen2_5OmniToken2Wav:
    """Qwen2.5-Omni token2wav (DiT + BigVGAN) as an omnitrio stage."""

    checkpoint = "qwen2.5-omni"  # model_path: one folder shared with the family's other stages
    max_inputs_per_step: int | None = None
    max_payloads_per_step = 0
    max_visible_per_step: int

    @classmethod
    def step_limits(cls, params: Mapping[str, object]) -> StepLimits:
        """What one step emits with these params (the config is checked by it)."""
        windows = params.get("max_windows_per_step", MAX_WINDOWS_PER_STEP)  # or in **kwargs
        if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
            raise ValueError(f"max_windows_per_step must be a positive integer, got {windows!r}")
        return StepLimits(cls.max_payloads_per_step, windows)

    def __init__(
        self,
        name: str,
        device: str = "cpu",
        *,
        model_path: str,
        chunk_frames: int = 24,
        first_chunk_frames: int = 12,
        left_context_frames: int = 24,
        right_context_frames: int = 12,
        max_windows_per_step: int = MAX_WINDOWS_PER_STEP,
        max_codes: int = 4096,
        sample_rate_hz: int = 24000,
        num_ode_steps: int = 10,
        guidance_scale: float = 0.5,
        sway_coefficient: float = -1.0,
        seed: int = 0,
        speaker: str = "Chelsie",
        num_threads: int | None = None,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        for label, value in (
            ("chunk_frames", chunk_frames),
            ("first_chunk_frames", first_chunk_frames),
        ):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if left_context_frames < 0 or right_context_frames < 0:
            raise ValueError("context frames must be at least 0")
        self.device = stage_device(name, device)
        self.name = name
        folder = stage_folder(model_path, "token2wav")
        model = load_stage_model(Qwen2_5OmniToken2WavModel, folder, name).float()
        self.model = model.to(self.device)
        self.speakers = load_speakers(folder, name)
        self.default_speaker = speaker_of(speaker, self.speakers, speaker)
        self.chunk_frames = chunk_frames
        self.first_chunk_frames = first_chunk_frames
        self.left_context_frames = left_context_frames
        self.right_context_frames = right_context_frames
        self.max_codes = max_codes
        self.sample_rate_hz = sample_rate_hz
        self.ode = {
            "num_steps": num_ode_steps,
            "guidance": guidance_scale,
            "sway": sway_coefficient,
        }
        self.seed = seed
        limits = self.step_limits({"max_windows_per_step": max_windows_per_step})
        self.max_visible_per_step = limits.max_visible_per_step
        dit = self.model.code2wav_dit_model
        self.repeats = int(dit.repeats)
        self.samples_per_code = self.repeats * math.prod(
            self.model.config.bigvgan_config.upsample_rates
        )
        self.streams: dict[str, _Stream] = {}
        self._counts = {"windows": 0, "codes": 0, "samples": 0}
        self._decode_s = 0.0

    def open_stream(self, stream_id: str, request: Request) -> None:
        asked = request.options.knobs.get("speaker")
        speaker = self.speakers[speaker_of(asked, self.speakers, self.default_speaker)]
        seed = request.options.knobs.get(f"{self.name}.seed", request.options.seed)
        seed = self.seed if seed is None else seed
        generator = torch.Generator().manual_seed(int(seed or 0))
        mel_dim = self.model.code2wav_dit_model.mel_dim
        # Drawn on the host (the reference's draw), then kept on the device.
        noise = torch.randn([1, self.max_codes * self.repeats, mel_dim], generator=generator)
        self.streams[stream_id] = _Stream(
            noise.to(self.device),
            speaker["cond"].float().to(self.device),
            speaker["ref_mel"].float().to(self.device),
        )

    def close_stream(self, stream_id: str) -> None:
        del self.streams[stream_id]

    def close(self) -> None:
        self.streams.clear()

    @torch.no_grad()
    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        outputs: dict[str, StreamOutput] = {}
        windows: list[_Window] = []
        for work in batch:
            problem = self._take(self.streams[work.stream_id], work.inputs)
            if problem is not None:
                outputs[work.stream_id] = StreamOutput(error=problem)
            else:
                windows += self._plan(work.stream_id, work.input_closed)
        chunks = self._decode(windows)
        for work in batch:
            if work.stream_id in outputs:
                continue
            stream = self.streams[work.stream_id]
            more = self._next_window_end(stream, work.input_closed) is not None
            outputs[work.stream_id] = StreamOutput(
                visible=tuple(chunks.get(work.stream_id, ())),
                more=more,
                done=work.input_closed and not more,
            )
        return outputs

    def stage_statistics(self) -> Mapping[str, float]:
        """Windows decoded, codes decoded (context included), mean decode time per window,
        audio made, and the real-time factor (decode time / audio time)."""
        counts = self._counts
        audio_s = counts["samples"] / self.sample_rate_hz
        return {
            "num_windows": counts["windows"],
            "num_codes_decoded": counts["codes"],
            "decode_ms_mean": 1000 * self._decode_s / counts["windows"]
            if counts["windows"]
            else 0.0,
            "audio_s": audio_s,
            "real_time_factor": self._decode_s / audio_s if audio_s else 0.0,
        }

    def _take(self, stream: _Stream, inputs: Sequence[object]) -> Exception | None:
        for item in inputs:
            if not isinstance(item, CodecCodes):
                return TypeError(f"token2wav got a {type(item).__name__} from the talker")
            stream.codes.extend(item.codes)
        if len(stream.codes) > self.max_codes:
            return ValueError(f"more than max_codes={self.max_codes} codes; raise max_codes")
        return None

    def _plan(self, stream_id: str, input_closed: bool) -> list[_Window]:
        """The stream's windows that are ready, up to ``max_windows_per_step``, in order."""
        stream, windows = self.streams[stream_id], list[_Window]()
        while len(windows) < self.max_visible_per_step:
            end = self._next_window_end(stream, input_closed)
            if end is None:
                break
            start = stream.num_emitted
            left = max(0, start - self.left_context_frames)
            right = min(len(stream.codes), end + self.right_context_frames)
            windows.append(_Window(stream_id, left, start, end, right))
            stream.num_emitted = end
        return windows

    def _next_window_end(self, stream: _Stream, input_closed: bool) -> int | None:
        """Where the next window ends (exclusive, in codes), or None if it is not ready."""
        start, have = stream.num_emitted, len(stream.codes)
        size = self.first_chunk_frames if start == 0 else self.chunk_frames
        if have >= start + size + self.right_context_frames:
            return start + size
        if input_closed and have > start:
            return min(have, start + size)
        return None

    def _decode(self, windows: list[_Window]) -> dict[str, list[AudioChunk]]:
        """Decode windows of equal shape together (one ODE solve, one vocoder call)."""
        groups: dict[tuple[int, tuple[int, ...]], list[_Window]] = {}
        for window in windows:
            ref_shape = tuple(self.streams[window.stream_id].reference_mel.shape)
            groups.setdefault((window.right - window.left, ref_shape), []).append(window)
        pieces: dict[_Window, bytes] = {}
        for group in groups.values():
            pieces.update(self._decode_group(group))
        chunks: dict[str, list[AudioChunk]] = {}
        for window in windows:  # each stream's windows stay in order
            audio = AudioChunk(pieces[window], self.sample_rate_hz)
            chunks.setdefault(window.stream_id, []).append(audio)
        return chunks

    def _decode_group(self, group: list[_Window]) -> dict[_Window, bytes]:
        started = time.perf_counter()
        pairs = [(self.streams[w.stream_id], w) for w in group]
        streams = [s for s, _ in pairs]
        r = self.repeats
        codes = torch.tensor(
            [s.codes[w.left : w.right] for s, w in pairs], device=self.device
        )  # [B, n]
        noise = torch.cat([s.noise[:, w.left * r : w.right * r] for s, w in pairs])  # [B, n*r, mel]
        conditioning = torch.cat([s.conditioning for s in streams])  # [B, E]
        reference_mel = torch.cat([s.reference_mel for s in streams])  # [B, T, mel]
        mel = self._mel(conditioning, reference_mel, codes, noise)  # [B, mel, n * r]
        waves = self.model.code2wav_bigvgan_model(mel).reshape(len(group), -1)  # [B, n * spc]
        spc, out = self.samples_per_code, {}
        for row, window in enumerate(group):
            keep = waves[row, (window.start - window.left) * spc : (window.end - window.left) * spc]
            out[window] = to_pcm16(keep)
            self._counts["samples"] += keep.numel()
        self._decode_s += time.perf_counter() - started
        self._counts["windows"] += len(group)
        self._counts["codes"] += codes.numel()
        return out

    def _mel(
        self,
        conditioning: torch.Tensor,
        reference_mel: torch.Tensor,
        codes: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """The DiT's ``sample`` with a given starting noise (same operations, same order)."""
        dit: Any = self.model.code2wav_dit_model
        guidance, duration = self.ode["guidance"], noise.shape[1]
        conditioning = conditioning.unsqueeze(1).repeat(1, duration, 1)  # [B, n*r, E]

        def velocity(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
            if guidance < 1e-5:
                return dit(
                    hidden_states=state,
                    speaker_embedding=conditioning,
                    condition_vector=reference_mel,
                    quantized_code=codes,
                    time_step=time_step,
                    drop_audio_conditioning=False,
                    drop_code=False,
                    apply_cfg=False,
                )
            out = dit(
                hidden_states=state,
                quantized_code=codes,
                speaker_embedding=conditioning,
                condition_vector=reference_mel,
                time_step=time_step,
                apply_cfg=True,
            )
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * guidance

        times = torch.linspace(
            0, 1, int(self.ode["num_steps"]), dtype=conditioning.dtype, device=self.device
        )
        sway = self.ode["sway"]
        if sway is not None:
            times += sway * (torch.cos(torch.pi / 2 * times) - 1 + times)
        solver = RungeKutta4ODESolver(function=velocity, initial_value=noise)
        return solver.integrate(times)[-1].permute(0, 2, 1)


@dataclass(frozen=True, slots=True)
class _Window:
    """Codes [left, right) decoded; samples of [start, end) kept."""

    stream_id: str
    left: int
    start: int
    end: int
    right: int


def to_pcm16(wave: torch.Tensor) -> bytes:
    """[-1, 1] float samples (any device) -> PCM16 little-endian bytes: the host copy."""
    samples = (wave.clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16).cpu()
    return samples.numpy().astype("<i2").tobytes()
