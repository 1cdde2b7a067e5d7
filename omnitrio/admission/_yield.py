"""The audio one stream-step yields at a stage (``StepModel.audio_s_per_stream_step``,
``_headroom.py``), learned from the streams that play and from those that completed.

**The playing streams' yield** (``StreamFlow``, ``Yield.stepped``): for each stream,
the stage's steps since its first audio against the audio delivered since then,
counted up to the latest step here at which more of its audio had arrived. A stage's
steps run ahead of the audio they become (the steps before a stream's first audio
yield nothing yet), but once audio flows both move at the stream's pace, so this is
the steady-state yield: what a client playing since the first chunk needs the stage to
keep up with. Counting to the latest new audio (not the latest step) keeps the chunks'
lag out of it, and the first chunk (made before its client plays) and a last chunk
that comes after the stream's last step here (a vocoder's padded final window: 2 s of
audio for a 12-frame tail) out of it too: over whole streams, audio over steps would
read such a tail as yield (12 % high on ``bench-qwen3-omni.yaml``'s talker, which then
admitted 224 streams where 192 is the limit).

Until the streams have played ``MIN_FLOW_AUDIO_S`` so, the yield is that of the
streams that completed (their audio over the steps they took here, ``Yield.completed``),
else audio delivered over all stream-steps so far (a lower bound: every second of audio
came from a step already taken; ``StepModel`` falls back to it). Nothing is shed before
a stream completed (``settled``).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_FLOW_AUDIO_S = 0.5
"""Audio the playing streams delivered past their first chunks before a stage's yield
comes from them (``StreamFlow``) rather than from completed streams."""
YIELD_KEEP = 0.98
"""Weight of the past in the completed streams' audio per stream-step, per stream."""
FLOW_HALF_LIFE_STEPS = 20000.0
"""Half-life, in stream-steps, of the past in the playing streams' yield."""

_FLOW_KEEP = float(0.5 ** (1.0 / FLOW_HALF_LIFE_STEPS))


@dataclass(slots=True)
class StreamFlow:
    """One stream at one stage, for its steady-state yield: the stage's steps and the
    stream's audio since the stage's first step after its first audio, as of the
    latest step here at which more of its audio had arrived (``Yield.stepped``)."""

    mark_steps: int | None = None
    mark_audio_s: float = 0.0
    steps: int = 0
    audio_s: float = 0.0


class Yield:
    """One stage's audio per stream-step, from its playing and its completed streams."""

    def __init__(self) -> None:
        self.num_completed = 0
        self._completed_audio_s = 0.0  # weighted sums over completed streams
        self._completed_steps = 0.0
        self._flow_steps = 0.0  # weighted sums over the playing streams' counted steps
        self._flow_audio_s = 0.0

    def stepped(self, flow: StreamFlow, num_steps: int, audio_s: float) -> None:
        """A stream took its ``num_steps``-th step here; ``audio_s`` of its audio has been
        delivered so far. Once more of its audio has come since its last count here,
        the steps and audio since then join the yield."""
        if flow.mark_steps is None:
            if audio_s > 0:
                flow.mark_steps, flow.mark_audio_s = num_steps, audio_s
            return
        audio = audio_s - flow.mark_audio_s
        if audio <= flow.audio_s:  # no new audio yet: these steps' audio is on its way
            return
        steps = num_steps - flow.mark_steps
        new_steps = steps - flow.steps
        keep = _FLOW_KEEP**new_steps
        self._flow_steps = self._flow_steps * keep + new_steps
        self._flow_audio_s = self._flow_audio_s * keep + (audio - flow.audio_s)
        flow.steps, flow.audio_s = steps, audio

    def completed(self, num_steps: int, audio_s: float) -> None:
        """A stream completed after ``num_steps`` steps here and ``audio_s`` of audio."""
        if num_steps <= 0:
            return
        self.num_completed += 1
        self._completed_audio_s = self._completed_audio_s * YIELD_KEEP + audio_s
        self._completed_steps = self._completed_steps * YIELD_KEEP + num_steps

    @property
    def playing(self) -> float | None:
        """The playing streams' yield (None: they have not played ``MIN_FLOW_AUDIO_S``)."""
        if self._flow_audio_s >= MIN_FLOW_AUDIO_S and self._flow_steps > 0:
            return self._flow_audio_s / self._flow_steps
        return None

    @property
    def of_completed(self) -> float | None:
        """The completed streams' audio over their steps here (None: none with audio)."""
        if self._completed_steps > 0 and self._completed_audio_s > 0:
            return self._completed_audio_s / self._completed_steps
        return None

    @property
    def settled(self) -> bool:
        """A stream with audio completed here."""
        return self._completed_audio_s > 0
