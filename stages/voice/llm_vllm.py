"""The voice LLM's answers on vLLM (``runtime: vllm``): any chat model vLLM loads, by
its safetensors folder, on the engine the field runs LLMs on (GPU hosts; vLLM's CPU
build runs it here too). CTranslate2 stays the CPU default.

vLLM runs in a process and environment of its own (``stages.kit.VllmEngine``,
``scripts/setup vllm``). Unlike CTranslate2 and llama.cpp, which give each answer a
worker, vLLM batches every answer it holds into one step: this runtime's one thread
(the driver) adds the answers the stage starts, aborts those it cancels, and steps
the engine while any answer is unfinished, handing each step's tokens to the stage
as the other runtimes do (llm_fast.py). The stage tokenizes the prompt and
detokenizes the answer; the engine sees token ids only.

The stage's sampling goes to vLLM's: greedy unless the request sets ``temperature``
(``top_p``, ``top_k``), and ``repetition_penalty``, which vLLM applies to the prompt's
tokens as well as the answer's (the stage's torch sampler: the answer's only). A
request vLLM refuses (a prompt longer than its ``max_model_len``) fails that answer
alone, as an ``OptionError`` carrying vLLM's reason; the engine process ending fails
every answer it held.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stages.kit import OptionError, SamplingParams, VllmEngine, VllmRequestError

from .llm_fast import FastAnswer, TokenHandover

logger = logging.getLogger(__name__)


@dataclass
class VllmAnswer(FastAnswer):
    """One answer: what the engine needs, and what it has made (its tokens: llm_fast.py)."""

    request_id: str
    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    end_tokens: list[int]
    added: bool = False  # the engine holds it
    ended: bool = False  # the engine is done with it (finished, aborted or refused)
    error: BaseException | None = None

    def failed(self) -> bool:
        """Generation ended without its last token (an error: ``check`` raises it)."""
        return self.ended and self.error is not None and not self.arrived

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class VllmRuntime(TokenHandover):
    """One engine and its driver thread; the runtime's condition also says when answers
    are started or cancelled."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        max_num_seqs: int,
        max_model_len: int | None,
        kv_cache_bytes: int,
        compiled: bool = False,
    ) -> None:
        super().__init__()
        self.engine = VllmEngine.start(
            model_path,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            kv_cache_bytes=kv_cache_bytes,
            dtype=dtype,
            compiled=compiled,
        )
        self._ids = itertools.count()
        self._new: list[VllmAnswer] = []  # started, not yet added to the engine
        self._active: dict[str, VllmAnswer] = {}  # the engine holds them
        self._closed = False
        self._driver = threading.Thread(target=self._drive, name="vllm-driver", daemon=True)
        self._driver.start()

    def start(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        params: SamplingParams,
        end_tokens: Sequence[int],
        hold: Callable[[], None] | None = None,
    ) -> VllmAnswer:
        """Queue the answer (returns at once); tokens arrive in its ``arrived``. ``hold``
        is refused: one engine step serves every answer, none can wait alone."""
        if hold is not None:
            raise ValueError("runtime vllm cannot hold one answer (first_audio_first)")
        answer = VllmAnswer(
            f"answer-{next(self._ids)}", list(prompt), max_new_tokens, params, list(end_tokens)
        )
        with self._changed:
            if self._closed:
                raise RuntimeError("the vLLM runtime is closed")
            self._new.append(answer)
            self._changed.notify_all()
        return answer

    def unfinished(self) -> int:
        """Requests the engine still holds (an aborted one is freed at once)."""
        return self.engine.unfinished()

    def wait_ended(self, answer: VllmAnswer, timeout_s: float) -> bool:
        """Whether, within ``timeout_s``, the engine is done with ``answer`` (finished,
        aborted or refused)."""
        with self._changed:
            return self._changed.wait_for(lambda: answer.ended, timeout=timeout_s)

    def close(self, answers: Sequence[FastAnswer]) -> None:
        """Stop ``answers``, the driver and the engine process."""
        with self._changed:
            for answer in answers:
                answer.cancelled = True
            self._closed = True
            self._changed.notify_all()
        self._driver.join()
        self.engine.close()

    # ----- the driver's thread ----------------------------------------------------------

    def _drive(self) -> None:
        try:
            while self._round():
                pass
        except Exception as exc:  # the engine process failed: every answer it held fails
            logger.exception("vLLM runtime: the engine failed")
            with self._changed:
                for answer in [*self._new, *self._active.values()]:
                    answer.error, answer.ended = exc, True
                self._new.clear()
                self._active.clear()
                self._closed = True
                self._changed.notify_all()

    def _round(self) -> bool:
        """Add, abort, then one engine step; False once closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._new or self._active or self._closed)
            if self._closed:
                return False
            new, self._new = self._new, []
            gone = [a for a in self._active.values() if a.cancelled]
        for answer in new:
            if not answer.cancelled:
                self._add(answer)
        if gone:
            self.engine.abort([a.request_id for a in gone])
        with self._changed:
            for answer in gone:
                del self._active[answer.request_id]
                answer.ended = True
            for answer in new:
                if answer.added:
                    self._active[answer.request_id] = answer
                else:
                    answer.ended = True
            self._changed.notify_all()
            if not self._active:
                return True
        outputs = self.engine.step()
        with self._changed:
            for out in outputs:
                answer = self._active.get(out.request_id)
                if answer is None:
                    continue
                last = len(out.new_token_ids) - 1
                for i, token in enumerate(out.new_token_ids):
                    answer.arrived.append((token, out.finished and i == last))
                if out.finished:
                    answer.ended = True
                    del self._active[out.request_id]
                    if not out.new_token_ids:  # nothing to mark as the last token
                        answer.error = RuntimeError(
                            f"vLLM ended the answer ({out.finish_reason}) with no last token"
                        )
            self._changed.notify_all()
        return True

    def _add(self, answer: VllmAnswer) -> None:
        params = answer.params
        try:
            self.engine.add(
                answer.request_id,
                answer.prompt,
                max_tokens=answer.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                repetition_penalty=params.repetition_penalty,
                stop_token_ids=answer.end_tokens,
            )
        except VllmRequestError as exc:
            answer.error = OptionError(str(exc))  # this answer's error alone (stage kit)
        else:
            answer.added = True
