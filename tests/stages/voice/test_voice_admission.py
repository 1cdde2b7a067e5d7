"""The voice chat's admission on the statistics its TTS stage showed at four
conversations (issue 24): a late answer is kept, not shed (no timing here)."""

from __future__ import annotations

from pathlib import Path

import omnitrio
from omnitrio.admission._headroom import StepModel
from omnitrio.admission._rule import Admission

VOICE_CHAT = Path(__file__).resolve().parents[3] / "configs" / "voice-chat.yaml"


def _tts_at_four_conversations() -> tuple[StepModel, float]:
    """A TTS step model whose factor for 4 streams is just under 1 (as measured: 0.94),
    though the stage is mostly idle: most stream-steps only take a text delta, and a
    batch with more streams in it more often synthesizes a phrase."""
    model = StepModel(16)
    audio_s = 0.0
    for _ in range(12):
        steps = 0
        for batch in (1, 2, 3, 4) * 10:
            model.observe(batch, 0.01 + 0.03 * batch)
            steps += 1
        audio_s += 2.5
        model.completed(steps, 2.5)
    return model, audio_s


def _admission(config: omnitrio.PipelineConfig) -> Admission:
    section = config.pipeline  # as the pipeline makes it (omnitrio/_pipeline.py)
    return Admission(
        section.max_streams,
        section.realtime_margin,
        headroom=section.admission == "headroom",
        busy=section.admission == "busy",
        cpu=section.admission == "cpu",
    )


def test_the_voice_chat_keeps_a_late_answer_that_headroom_admission_would_shed() -> None:
    model, audio_s = _tts_at_four_conversations()
    assert model.realtime_factor(4, audio_s) < 0.95  # what headroom admission sheds on
    config = omnitrio.load_config(VOICE_CHAT)
    headroom = config.model_copy(
        update={"pipeline": config.pipeline.model_copy(update={"admission": "headroom"})}
    )
    assert _admission(headroom).behind(model, 4, audio_s)
    assert config.pipeline.admission == "cpu"  # the default: by the cores the stages share
    voice = _admission(config)
    assert voice.cpu is not None  # by the cores the stages share (no opinion yet here)
    assert not voice.behind(model, 4, audio_s)
    assert voice.refusal(4, 8, [("tts", model)], audio_s) is None
    # max_streams stays the cap (a speculative answer counts as a stream)
    cap = config.pipeline.max_streams
    assert voice.refusal(cap, cap, [("tts", model)], audio_s) is not None
