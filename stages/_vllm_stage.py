"""What a stage whose critical path runs on vLLM shares (``engine: vllm``): adding a
stream's request with its sampling params, aborting it when the stream closes, closing
the engine with the stage, and the engine's figures in the stage's statistics.

A subclass sets ``self.engine`` (a started ``VllmEngine``) and keeps per-stream state in
``self.streams`` with ``engine_done`` (the engine finished the request) and
``pending`` (token ids the engine made that the stream has not taken yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omnitrio import StreamWork
from stages._torch_sampling import SamplingParams
from stages._torch_stage import AutoregressiveStage
from stages._vllm_engine import VllmEngine


class VllmEngineStage(AutoregressiveStage):
    """Put it before the stage's torch class: ``class X(VllmEngineStage, TorchStage)``."""

    engine: VllmEngine

    def add_request(
        self, stream_id: str, ids: list[int], params: SamplingParams, stop: list[int], **extra: Any
    ) -> None:
        """The stream's request, sampled as ``params`` say; ``extra``: ``VllmEngine.add``'s
        hidden-state and audio arguments. vLLM's repetition penalty counts the prompt's
        tokens and the answer's, as transformers' ``generate`` does."""
        self.engine.add(
            stream_id,
            ids,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            repetition_penalty=params.repetition_penalty,
            seed=params.seed,
            stop_token_ids=stop,
            **extra,
        )

    def engine_round(self, batch: Sequence[StreamWork]) -> dict[str, Any]:
        """The batch's streams, after one engine step if a stream of the batch waits for
        a token the engine has yet to make (``_engine_step``: the stage's own)."""
        streams = {work.stream_id: self.streams[work.stream_id] for work in batch}
        waiting = [s for s in streams.values() if not s.finished and not s.pending]
        if any(not s.engine_done for s in waiting):
            self._engine_step()
        return streams

    def _engine_step(self) -> None:
        raise NotImplementedError

    def close_stream(self, stream_id: str) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None and not stream.engine_done:
            self.engine.abort([stream_id])  # the engine frees the request's KV blocks
        super().close_stream(stream_id)

    def close(self) -> None:
        self.engine.close()
        super().close()

    def engine_statistics(self) -> Mapping[str, float]:
        engine = self.engine
        steps = max(engine.num_steps, 1)
        return {
            **self.clock.snapshot(self.packager),
            "num_active_streams": len(self.streams),
            "engine_start_s": self.engine.start_s,
            # The engine's own count after its last step or abort (no call from here:
            # statistics are read from trio and must not wait for a step).
            "engine_requests": self.engine.num_unfinished,
            "engine_buffered_tokens": sum(len(s.pending) for s in list(self.streams.values())),
            # Where a step's time goes: the stage's wait (pipe included), the engine's
            # LLMEngine.step() and, of it, the model's forward (the rest is vLLM's Python).
            "engine_steps": engine.num_steps,
            "engine_step_ms_mean": 1000 * engine.step_s / steps,
            "engine_core_step_ms_mean": 1000 * engine.core_step_s / steps,
            "engine_forward_ms_mean": 1000 * engine.forward_s / steps,
        }


def one_placeholder(ids: list[int], placeholder: int) -> list[int]:
    """``ids`` with each run of ``placeholder`` given as one: vLLM's multimodal processor
    expands it again, to the audio's frames (given expanded, it would expand each)."""
    return [t for i, t in enumerate(ids) if t != placeholder or i == 0 or ids[i - 1] != t]


def check_prompt_rows(stage: str, engine_rows: int, length: int) -> None:
    """The engine ran the prompt at the stage's own ``length`` (its hidden-state rows):
    otherwise vLLM expanded an audio placeholder to another count than the stage's."""
    if engine_rows != length:
        raise RuntimeError(
            f"stage {stage!r}: the vLLM engine ran a prompt of {engine_rows} tokens, not the "
            f"stage's {length} (its audio placeholder expanded differently)"
        )
