"""The voice LLM's answers on CTranslate2 (int8 on the CPU), the stage's fast runtime.

CTranslate2 is installed with faster-whisper and runs a decoder LM without a compile
step. Decoding SmolLM2-135M takes ~21 ms per token on one thread against ~58 ms in
torch bfloat16 (docs/models.md). The weights are converted once from the stage's
safetensors folder into the omnitrio cache (~10 s, with a progress bar).

Each answer is one asynchronous ``generate_batch`` call: CTranslate2 runs up to
``num_workers`` of them at once, each on its own thread, so no conversation's
answer waits for another's whole answer (a further one queues until a worker is
free). Each token comes back through a callback into the answer's queue; the stage's
step takes what has arrived. The system message and the conversation's earlier turns
are passed as the ``static_prompt``: CTranslate2 keeps its KV state (one map per
loaded model, shared by the workers) and reuses it in every later answer that starts
with the same tokens, so an answer prefills only its question. Once an answer has
ended, the next turn's static prompt is known and is prefilled ahead on a warming
thread; the kept states are bounded by replacing the generator (llm_ct2_states.py).

CTranslate2 has no hook to mask the logits, so turns that may call a tool (a
grammar-constrained call) and turns with a ``seed`` stay on the stage's torch model.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import ctranslate2
from tqdm import tqdm

from omnitrio import trim_heap
from stages.kit import SamplingParams

from .llm_ct2_states import (
    Key,
    RecycleJob,
    ReleaseJob,
    StaticStates,
    Warmer,
    WarmJob,
    WarmTarget,
    prefill,
)
from .llm_fast import FastAnswer, TokenHandover, hand_over

logger = logging.getLogger(__name__)

CACHE_SUFFIX = "-ct2-int8"


def ensure_ct2(folder: Path, cache_root: Path) -> Path:
    """The CTranslate2 int8 copy of the safetensors ``folder`` in ``cache_root``,
    converted first if it is not there yet (atomically: a half-written copy is never
    used)."""
    target = cache_root / f"{folder.name}{CACHE_SUFFIX}"
    if (target / "model.bin").is_file():
        return target
    from ctranslate2.converters import TransformersConverter

    cache_root.mkdir(parents=True, exist_ok=True)
    with (
        tqdm(total=1, desc=f"converting {folder.name} to CTranslate2 int8 (once)") as bar,
        tempfile.TemporaryDirectory(dir=cache_root, prefix=".convert-") as scratch,
    ):
        TransformersConverter(str(folder)).convert(scratch, quantization="int8", force=True)
        os.replace(scratch, target)
        os.makedirs(scratch)  # the context manager removes it again
        bar.update()
    return target


@dataclass
class Ct2Answer(FastAnswer):
    """One answer being generated (its tokens: llm_fast.py)."""

    result: ctranslate2.AsyncGenerationResult | None = None
    static_kept: bool = False  # its static prompt's state was kept (or being made) already

    def failed(self) -> bool:
        """Generation ended without its last token (an error: ``check`` raises it)."""
        return self.result is not None and self.result.done() and not self.arrived

    def check(self) -> None:
        if self.result is not None and self.result.done():
            self.result.result()  # raises the generation's error, if any

    def ended(self) -> bool:
        """Its generation is over (or never started): its worker is free."""
        return self.result is None or self.result.done()


class Ct2Runtime(TokenHandover, WarmTarget):
    """The generator, whose callbacks hand each token over (llm_fast.py), and the
    static prompts' states it keeps (llm_ct2_states.py: bounded by ``cache_tokens``)."""

    def __init__(
        self,
        folder: Path,
        *,
        num_workers: int,
        num_threads: int,
        cache_tokens: int,
        nice: int = 0,
    ) -> None:
        generator = partial(
            ctranslate2.Generator,
            str(folder),
            device="cpu",
            compute_type="int8",
            inter_threads=num_workers,
            intra_threads=num_threads,
        )
        self._open = generator if not nice else partial(niced, nice, generator)
        self.generator = self._open()
        self.states = StaticStates(cache_tokens)
        self._lock = threading.Lock()  # the generator, the ledger, the answers
        self._answers: list[Ct2Answer] = []  # started on the current generator
        self._retired: list[tuple[ctranslate2.Generator, list[Ct2Answer]]] = []
        self._spare: ctranslate2.Generator | None = None  # unloaded: its threads kept
        self._recycling = False
        super().__init__()
        self._warmer = Warmer(self)

    @property
    def num_generators(self) -> int:
        """The generators loaded: the current one and those whose answers still run."""
        with self._lock:
            return 1 + len(self._retired)

    def start(
        self,
        static_prompt: Sequence[str],
        prompt: Sequence[str],
        *,
        max_new_tokens: int,
        params: SamplingParams,
        end_tokens: Sequence[int],
        hold: Callable[[], None] | None = None,
    ) -> Ct2Answer:
        """Start generating (returns at once); tokens arrive in the answer's ``arrived``.
        ``hold``, called on CTranslate2's thread after each token but the last, may wait:
        the next token waits with it (first_audio.py)."""
        answer = Ct2Answer()
        changed = self._changed  # not self: a worker thread must never drop the generator

        def arrived(step: ctranslate2.GenerationStepResult) -> bool:
            hand_over(changed, answer, step.token_id, step.is_last)
            if hold is not None and not step.is_last and not answer.cancelled:
                hold()
            return answer.cancelled  # True stops the generation

        sampling = (
            {"sampling_topk": 1}
            if params.temperature == 0
            else {
                "sampling_topk": params.top_k,  # 0: the whole vocabulary
                "sampling_topp": params.top_p,
                "sampling_temperature": params.temperature,
            }
        )
        with self._lock:
            retired = bool(self._retired)
        if retired:  # dropped on the warming thread, not on this answer's path
            self._warmer.submit(ReleaseJob())
        with self._lock:  # held while it is queued: a fresh generator waits for it
            if static_prompt:
                answer.static_kept = self.states.add(tuple(static_prompt), pending=False)
                self._check_budget()
            (answer.result,) = self.generator.generate_batch(
                [list(prompt)],
                static_prompt=list(static_prompt) or None,
                include_prompt_in_result=False,
                max_length=max_new_tokens,
                repetition_penalty=params.repetition_penalty,
                end_token=list(end_tokens),
                return_end_token=True,
                callback=arrived,
                asynchronous=True,
                **sampling,
            )
            self._answers = [a for a in self._answers if not a.ended()]
            self._answers.append(answer)
        return answer

    def warm(self, static_prompt: Sequence[str], before: Callable[[], None] | None) -> None:
        """Prefill ``static_prompt`` ahead on the warming thread (after ``before``), so
        an answer that starts with it later finds its state kept."""
        key = tuple(static_prompt)
        with self._lock:
            if not key or key in self.states:
                return
        self._warmer.submit(WarmJob(key, before))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the states asked for so far are warm; False after ``timeout_s``."""
        return self._warmer.flush(timeout_s)

    def warm_now(self, key: Key) -> None:
        with self._lock:
            if key in self.states:
                return
            fits = self.states.fits(key)
        if not fits:
            self._recycle()  # on this thread, before the state is made: the budget holds
        with self._lock:
            if key in self.states:
                return
            self.states.add(key, pending=True)
            self.states.num_warmed += 1
            generator = self.generator
            self._check_budget()
        prefill(generator, key, start=key[0])

    def _check_budget(self) -> None:
        """Ask the warming thread for a fresh generator once the ledger is over its
        budget (the lock held; an answer that starts adds its state at once)."""
        if self.states.over_budget() and not self._recycling:
            self._recycling = True
            self._warmer.submit(RecycleJob())

    def recycle_now(self) -> None:
        with self._lock:
            self._recycling = False
            if not self.states.over_budget():
                return  # the warming thread has replaced it since
        self._recycle()

    def _recycle(self) -> None:
        """A fresh generator in place of the current one (on the warming thread)."""
        with self._lock:
            fresh, self._spare = self._spare, None
        if fresh is None:
            fresh = self._open()  # ~0.15 s, off the stage's thread
        else:
            fresh.load_model()  # the weights again, into the same worker threads
        with self._lock:
            self._retired.append((self.generator, self._answers))
            self.generator, self._answers = fresh, []
            carried = self.states.restart()
        for key in carried:
            self.warm_now(key)
        self._release_retired()

    def release_now(self) -> None:
        self._release_retired()

    def _release_retired(self) -> None:
        """Unload the replaced generators whose answers have all ended (their states go
        with their model), then give the freed memory back (``trim_heap``); one is kept
        unloaded as the next fresh one, so recycling does not start new threads."""
        with self._lock:
            done = [r for r in self._retired if all(a.ended() for a in r[1])]
            self._retired = [r for r in self._retired if r not in done]
        if not done:
            return
        for generator, _ in done:
            generator.unload_model()  # nothing runs on it: frees the weights and states
            if generator.model_is_loaded:
                continue  # a batch still finishing: dropped, not kept
            with self._lock:
                if self._spare is None:
                    self._spare, generator = generator, None
        done.clear()  # the generators not kept go here, outside the lock
        trim_heap()

    def close(self, answers: Sequence[Ct2Answer]) -> None:
        """Stop ``answers`` (still generating or not) and wait until they have stopped;
        then stop the warming thread."""
        for answer in answers:
            answer.cancelled = True
        for answer in answers:
            if answer.result is not None:
                answer.result.result()
        self._warmer.close()
        self._release_retired()


def niced(nice: int, open_generator: Callable[[], ctranslate2.Generator]) -> ctranslate2.Generator:
    """``open_generator()`` on a thread of its own whose nice value is raised by
    ``nice``: the generator's worker threads (and their OpenMP threads) are made there
    and keep it (Linux: a thread's nice value is its own, and threads it starts inherit
    it; raising it needs no privilege). The LLM param ``ctranslate2_nice``. Elsewhere a
    thread's nice value is the process's, so the generator opens as it is, with a warning."""
    if sys.platform != "linux":
        logger.warning(
            "ctranslate2_nice=%d needs Linux; the LLM's threads keep their priority", nice
        )
        return open_generator()
    opened: list[ctranslate2.Generator] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            tid = threading.get_native_id()  # made by the caller's: its nice value
            os.setpriority(
                os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice)
            )
            opened.append(open_generator())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="ct2-open", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return opened[0]
