"""What the sglang-omni peer runs: a synthetic config's three stages as the peer's spec.

The peer (``benchmarks/peers/sglang_omni/``) runs the same step-time model as
``stages.synthetic.SyntheticStage`` on sglang-omni's own scheduler hooks; this module
reads that model from omnitrio's config (the stage profiles ``omnitrio bench`` computes
its bounds from, after ``--host-ms``, ``--set`` and ``--cpu-bound``) and writes it as the
JSON spec the peer's driver takes. Batch limits are the config's ``max_batch_size``
(the thinker's and talker's ``max_running_requests``, code2wav's ``max_replay_rows``).
"""

from __future__ import annotations

from typing import Any

from omnitrio import PipelineConfig

from ..harness._profile import StageProfile, synthetic_profiles


class PeerConfigError(ValueError):
    """The config is not one the peer can run (three synthetic stages, Qwen-Omni shaped)."""


def _step(profile: StageProfile, cpu_bound: bool) -> dict[str, float | int | bool]:
    return {
        "service_ms": profile.step_s * 1000,
        "per_stream_ms": profile.per_stream_s * 1000,
        "host_ms": profile.host_s * 1000,
        "prefill_ms": profile.prefill_s * 1000,
        "prefill_ms_per_word": profile.prefill_per_word_s * 1000,
        "replicas": profile.replicas,
        "cpu_bound": cpu_bound,
    }


def peer_spec(config: PipelineConfig) -> dict[str, Any]:
    """The peer's spec for ``config``: thinker (source, text), talker, code2wav (audio)."""
    profiles = synthetic_profiles(config)
    if profiles is None or len(profiles) != 3:
        raise PeerConfigError(
            f"--baseline sglang-omni runs three synthetic stages (thinker, talker, code2wav); "
            f"{config.pipeline.name} has {len(config.stages)} stages"
            + ("" if profiles is not None else ", not all stages.synthetic:SyntheticStage")
        )
    thinker, talker, code2wav = profiles
    if thinker.steps is None or talker.steps is not None or code2wav.steps is not None:
        raise PeerConfigError("the first stage generates (steps set), the others take inputs")
    if code2wav.audio_s_per_visible is None:
        raise PeerConfigError(f"stage {code2wav.name} must emit audio")
    params = [dict(spec.params) for spec in config.stages]
    cpu_bound = any(bool(p.get("cpu_bound", False)) for p in params)
    window = code2wav.window or code2wav.inputs_per_step
    # audio per decoded window: a window stage's unit is a whole window; an input-mode
    # stage shows audio every visible_every frames
    per_window = 1 if code2wav.window else window / max(code2wav.visible_every, 1)
    audio_samples = int(params[2].get("audio_samples", 320) * per_window)
    return {
        "thinker": {
            "step": _step(thinker, cpu_bound),
            "max_running_requests": thinker.max_batch_size,
            "steps": thinker.steps,
            "payload_bytes": int(params[0].get("payload_bytes", 0)),
        },
        "talker": {
            "step": _step(talker, cpu_bound),
            "max_running_requests": talker.max_batch_size,
            "frames_per_input": talker.frames_per_input or 1.0,
            "coalesce_frames": window,  # config.py: talker_stage matches the code2wav window
            "payload_bytes": int(params[1].get("payload_bytes", 0)),
        },
        "code2wav": {
            "step": _step(code2wav, cpu_bound),
            "window": window,
            "max_replay_rows": code2wav.max_batch_size,
            "audio_samples": audio_samples,
            "sample_rate_hz": int(params[2].get("sample_rate_hz", 16000)),
        },
    }
