"""vLLM as a stage's engine: ``LLMEngine`` in a process and environment of its own.

vLLM's CPU build pins what the project pins differently (transformers < 5.20,
llguidance < 1.8, numba 0.65, setuptools 78.1.1; its torchvision, torchaudio and
torchcodec from PyPI are CUDA builds), so the engine runs in ``.venv-vllm``
(``scripts/setup vllm``) as one child process per stage, ``stages/_vllm_worker.py``,
with the engine core in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). The
stage's worker thread drives it synchronously: ``add`` when a stream opens, one
``step`` per round (one ``LLMEngine.step()``), ``abort`` when a stream closes or is
cancelled. A frame each way is a few hundred bytes a step (token ids), plus hidden
states when a stage asks for them (a prompt's once; a row per token for a stage whose
next stage reads every token's).

``OMNITRIO_VLLM_PYTHON`` names the engine environment's Python; by default the
repository's ``.venv-vllm/bin/python``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stages._vllm_worker import read_frame, write_frame

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().with_name("_vllm_worker.py")


class VllmUnavailable(RuntimeError):
    """The vLLM engine's environment is not set up here (names what is missing)."""


class VllmEngineError(RuntimeError):
    """The engine process refused a command or died (names the command and the cause)."""


class VllmRequestError(ValueError):
    """vLLM refused one request (its prompt, its parameters): that stream's error alone."""


@dataclass(frozen=True)
class EngineOutput:
    """One request's part of a step: its new token ids, whether it finished (and why),
    and hidden states [layers, rows, hidden] if asked: the prompt's rows once, in the
    step that makes the first token; with ``token_states``, then each step's fed token's
    row (the state of answer token k comes with token k + 1)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    states: np.ndarray | None


def engine_python() -> Path:
    """The engine environment's Python, or VllmUnavailable saying how to make it."""
    configured = os.environ.get("OMNITRIO_VLLM_PYTHON")
    python = Path(configured) if configured else REPO / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        raise VllmUnavailable(
            f"the vLLM engine's environment is missing ({python} does not exist): "
            "run `scripts/setup vllm` (or set OMNITRIO_VLLM_PYTHON to a Python with vllm)"
        )
    return python


class VllmEngine:
    """One vLLM engine process; not thread-safe: one thread (the stage's) drives it."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.start_s = 0.0
        self.lock = threading.Lock()
        self.num_unfinished = 0  # requests the engine held after the last step or abort
        self.num_steps = 0
        self.step_s = 0.0  # the stage's wait for its steps: pipe and pickling included
        self.core_step_s = 0.0  # in LLMEngine.step(), in the engine process
        self.forward_s = 0.0  # of which in the model's forward

    @classmethod
    def start(
        cls,
        model: str,
        *,
        max_num_seqs: int = 32,
        max_model_len: int | None = 4096,
        kv_cache_bytes: int = 1 << 30,
        dtype: str = "float32",
        hidden_layers: list[int] | None = None,
        compiled: bool = False,
        audio: bool = False,
    ) -> VllmEngine:
        """Start the process and the engine on ``model`` (a checkpoint folder vLLM loads).
        ``max_model_len`` None: the checkpoint's own. ``hidden_layers``: transformers
        ``output_hidden_states`` indices whose prompt states each request that asks gets
        back. ``compiled``: vLLM's torch.compile path instead of eager (on a CPU, inductor
        kernels; the first start compiles for a minute, later ones read vLLM's cache);
        refused with ``hidden_layers``, whose hooks a compiled model does not run.
        ``audio``: requests may carry audio (vLLM's multimodal processor, which reads the
        checkpoint's processor and tokenizer files)."""
        if compiled and hidden_layers:
            raise ValueError(
                "vLLM engine: hidden_layers need the eager model (a compiled one runs no "
                "forward hooks); start it with compiled=False"
            )
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env.setdefault("OMP_NUM_THREADS", "1")  # vLLM's CPU worker ignores set_num_threads
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its log goes to our stderr
        process = subprocess.Popen(
            [str(engine_python()), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            env=env,
        )
        engine = cls(process)
        args = {
            "model": model,
            "max_num_seqs": max_num_seqs,
            "max_model_len": max_model_len,
            "kv_cache_memory_bytes": kv_cache_bytes,
            "dtype": dtype,
            "hidden_layers": hidden_layers,
            "compiled": compiled,
            "audio": audio,
        }
        if max_model_len is None:
            del args["max_model_len"]
        try:
            result = engine._call("start", args)
        except BaseException:
            engine.close()
            raise
        engine.start_s = float(result["start_s"])
        logger.info("vLLM engine on %s started in %.1f s", model, engine.start_s)
        return engine

    def add(
        self,
        request_id: str,
        prompt: list[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop_token_ids: list[int] | None = None,
        ignore_eos: bool = False,
        prompt_states: bool = False,
        token_states: bool = False,
        audio: tuple[np.ndarray, int] | None = None,
    ) -> None:
        """Add a request; ``prompt_states``: its prompt's hidden states come back (the
        engine's ``hidden_layers``), ``token_states``: every fed token's as well;
        ``audio``: (float32 waveform, sample rate) for the prompt's one audio placeholder
        token (an engine started with ``audio``)."""
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "repetition_penalty": repetition_penalty,
            "seed": seed,
            "stop_token_ids": stop_token_ids or [],
            "ignore_eos": ignore_eos,
        }
        states: bool | str = "every" if token_states else prompt_states
        self._call("add", request_id, prompt, params, states, audio, per_request=True)

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.num_unfinished = int(self._call("abort", request_ids))

    def step(self) -> list[EngineOutput]:
        outputs = []
        started = time.perf_counter()
        results, self.num_unfinished, (self.core_step_s, self.forward_s) = self._call("step")
        self.num_steps += 1
        self.step_s += time.perf_counter() - started
        for request_id, new, finished, reason, states in results:
            array = None
            if states is not None:
                shape, raw = states
                array = np.frombuffer(raw, dtype=np.float32).reshape(shape)
            outputs.append(EngineOutput(request_id, tuple(new), finished, reason, array))
        return outputs

    def unfinished(self) -> int:
        """How many requests the engine still holds (an aborted one is freed at once)."""
        return int(self._call("unfinished"))

    def close(self) -> None:
        """Stop the engine process (idempotent)."""
        process = self.process
        if process.poll() is None:
            try:
                with self.lock:
                    assert process.stdin is not None
                    assert process.stdout is not None
                    write_frame(process.stdin, ("close", ()))
                    read_frame(process.stdout)
            except (OSError, EOFError, ValueError):
                pass
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()

    def _call(self, command: str, *arguments: Any, per_request: bool = False) -> Any:
        process = self.process
        assert process.stdin is not None
        assert process.stdout is not None
        with self.lock:
            try:
                write_frame(process.stdin, (command, arguments))
                reply = read_frame(process.stdout)
            except (OSError, ValueError) as exc:
                reply = None
                logger.warning("vLLM engine process: %s failed: %s", command, exc)
        if reply is None:
            raise VllmEngineError(
                f"the vLLM engine process ended during {command!r} "
                f"(exit status {process.poll()}); its log is on stderr"
            )
        if reply[0] == "ok":
            return reply[1]
        _, kind, message = reply
        if per_request and kind in ("ValueError", "TypeError", "VLLMValidationError"):
            raise VllmRequestError(f"vLLM refused the request: {message}")
        raise VllmEngineError(f"vLLM engine: {command} failed: {kind}: {message}")
