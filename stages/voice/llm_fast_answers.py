"""The voice LLM's answers on a fast runtime (llm.py, llm_engines.py): started on the
runtime's own workers, their tokens taken as text at each step, and on CTranslate2 the
next turn's static prompt prefilled ahead once an answer has ended.

With the LLM's param ``first_audio_first``, such an answer whose first phrase is out
waits while any answer's first phrase is synthesised (first_audio.py: on few cores, the
first audio gets them); with ``first_audio_from_asr`` as well, while any other answer is
on its way to its first audio at all (its transcript, prefill and first phrase too);
with ``first_audio_min_slack_s``, only while its audio made runs out more than that
from now. The runtime calls the hold before each token (and CTranslate2's warming
thread before each prefill ahead).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from omnitrio import StreamOutput, TextDelta, VisibleItem

from .first_audio import FIRST_AUDIO
from .llm_answer import Answer, finish_event
from .llm_ct2 import Ct2Runtime
from .llm_fast import FastAnswer
from .llm_prompt import ChatPrompt
from .llm_vllm import VllmRuntime
from .payloads import TextPiece
from .trace import mark
from .trace import text as trace_text

if TYPE_CHECKING:  # llama-cpp-python is optional (runtime: llamacpp)
    from .llm_llamacpp import LlamaRuntime


class FastAnswers:
    """Starts answers on ``fast`` and takes their text."""

    def __init__(
        self,
        stage: str,
        runtime: str,
        fast: Ct2Runtime | LlamaRuntime | VllmRuntime,
        tokenizer: Any,
        stop_ids: set[int],
        prompt: ChatPrompt,
        *,
        first_audio_first: bool,
        cache_history: bool,
    ) -> None:
        self.stage = stage
        self.runtime = runtime
        self.fast = fast
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.prompt = prompt
        self.first_audio_first = first_audio_first  # first_audio.py
        self.cache_history = cache_history

    def start(self, sid: str, answer: Answer) -> FastAnswer:
        """``answer`` (its prompt built) generating on the runtime."""
        assert answer.prompt is not None
        hold = partial(FIRST_AUDIO.hold, sid) if self.first_audio_first else None
        if not isinstance(self.fast, Ct2Runtime):  # llama.cpp (it finds the cached prefix), vLLM
            return self.fast.start(
                answer.prompt,
                max_new_tokens=answer.max_new_tokens,
                params=answer.sampler.params,
                end_tokens=sorted(self.stop_ids),
                hold=hold,
            )
        tokens = self.tokenizer.convert_ids_to_tokens(answer.prompt)
        started = self.fast.start(
            tokens[: answer.static_len],  # its state is kept and reused (llm_ct2_states.py)
            tokens[answer.static_len :],
            max_new_tokens=answer.max_new_tokens,
            params=answer.sampler.params,
            end_tokens=sorted(self.stop_ids),
            hold=hold,
        )
        mark("llm_static_kept" if started.static_kept else "llm_static_new", sid)
        return started

    def tokens(self, sid: str, answer: Answer) -> StreamOutput:
        """The text of the tokens the runtime has made since the last step."""
        assert answer.fast is not None
        text = ""
        for token, last in self.fast.take(answer.fast):
            answer.generated.append(token)
            answer.stopped = token in self.stop_ids
            answer.finished = last
            text += answer.detok.add(None if answer.stopped else token, final=last)
        answer.text += text
        if not answer.finished and answer.fast.failed():
            answer.fast.check()
            raise RuntimeError(
                f"stage {self.stage!r}: the {self.runtime} runtime stopped without an end"
            )
        visible: list[VisibleItem] = [TextDelta(text)] if text else []
        if answer.finished:
            visible.append(finish_event(answer))
            if self.cache_history and isinstance(self.fast, Ct2Runtime):
                self._warm_next(sid, answer)
        payloads = (TextPiece(text),) if text and answer.wants_audio else ()
        if text and not answer.text_out:
            answer.text_out = True
            mark("llm_first_text", sid)
        if text:
            trace_text(sid, text)
        done = answer.finished
        return StreamOutput(payloads=payloads, visible=tuple(visible), more=not done, done=done)

    def _warm_next(self, sid: str, answer: Answer) -> None:
        """CTranslate2, an answer just ended: prefill the next turn's static prompt
        (this chat with the answer in it) ahead, on the runtime's warming thread."""
        assert isinstance(self.fast, Ct2Runtime)
        static = self.prompt.next_static(answer)
        if static is None:
            return  # the next prompt is cut at its start: it will not begin with this
        before = partial(FIRST_AUDIO.hold, sid) if self.first_audio_first else None
        self.fast.warm(self.tokenizer.convert_ids_to_tokens(static), before)

    def close(self, answers: list[Answer]) -> None:
        """Stop ``answers``' generation and the runtime."""
        generating = [a.fast for a in answers if a.fast is not None]
        self.fast.close(generating)  # type: ignore[arg-type]
