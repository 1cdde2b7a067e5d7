"""The vLLM engine's process: run by the engine environment's Python (``scripts/setup
vllm`` makes it), driven by ``stages/_vllm_engine.py`` over its stdin and stdout.

It imports nothing of omnitrio (the engine's environment has vLLM's own pins, not the
project's). One frame in, one frame out: a 4-byte big-endian length, then a pickled
tuple. In: ``(command, arguments)``; out: ``("ok", result)`` or ``("error", kind,
message)``. Commands: ``start``, ``add``, ``abort``, ``step``, ``unfinished``, ``close``. A ``step``
is one ``LLMEngine.step()``: each request's new token ids, whether it finished, and
(for a request that asked for them) its prompt's hidden states once, then, if it asked
for every token's, the states of the tokens fed in that step; ``step`` and
``abort`` also return how many requests the engine still holds, and ``step`` the
seconds spent so far in ``LLMEngine.step()`` and, of those, in the model's forward.

Hidden states: vLLM 0.32 has no public per-token hidden-state output. ``_StateHooks``
puts forward hooks on the decoder layers and maps each forward's rows to requests
through the model runner's batch (``input_batch.req_ids``, ``query_start_loc``):
vLLM internals, checked against ``CHECKED_VLLM_VERSION`` and refused on another.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time
from typing import Any, BinaryIO

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process

CHECKED_VLLM_VERSION = "0.32.0"


def read_frame(stream: BinaryIO) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return pickle.loads(stream.read(size))


def write_frame(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=5)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


class _StateHooks:
    """Per request, hidden states at the transformers ``output_hidden_states`` indices
    asked for (0: the layer-0 input, with audio merged; k: layer k-1's output; the number
    of layers: the final norm's output, transformers' last hidden state): the prompt's,
    once, and for a request that asks for every token's, each fed token's after it."""

    def __init__(self, engine: Any, layers: list[int]) -> None:
        import torch
        import vllm

        if vllm.__version__ != CHECKED_VLLM_VERSION:
            raise RuntimeError(
                f"the hidden-state hooks rely on vLLM {CHECKED_VLLM_VERSION} internals; "
                f"this engine environment has vLLM {vllm.__version__}"
            )
        core = engine.engine_core.engine_core
        self.runner = core.model_executor.driver_worker.worker.model_runner
        model = self.runner.model
        decoder = model.language_model.model
        self.torch, self.layers = torch, layers
        self.wanted: dict[str, int] = {}  # internal request id -> prompt length
        self.every: set[str] = set()  # requests that want every fed token's states too
        self.rows: dict[str, list[list[Any]]] = {}  # per request, per layer: row blocks
        self.sent: dict[str, int] = {}  # rows already returned, per request
        for slot, index in enumerate(layers):
            if index == 0:
                decoder.layers[0].register_forward_pre_hook(self._pre_hook(slot))
            elif index < len(decoder.layers):
                decoder.layers[index - 1].register_forward_hook(self._post_hook(slot))
            elif index == len(decoder.layers):
                decoder.norm.register_forward_hook(self._norm_hook(slot))
            else:
                raise ValueError(f"hidden-state layer {index} > {len(decoder.layers)} layers")

    def _pre_hook(self, slot: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            self._take(slot, args[1])

        return hook

    def _post_hook(self, slot: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], output: tuple[Any, Any]) -> None:
            self._take(slot, output[0] + output[1])  # vLLM keeps the residual apart

        return hook

    def _norm_hook(self, slot: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
            # With the residual passed in, vLLM's RMSNorm returns (normed, residual).
            self._take(slot, output[0] if isinstance(output, tuple) else output)

        return hook

    def _take(self, slot: int, states: Any) -> None:
        if not self.wanted:
            return
        batch = self.runner.input_batch
        starts = self.runner.query_start_loc.np
        for row, req_id in enumerate(batch.req_ids):
            if req_id not in self.wanted:
                continue
            # The prompt as vLLM runs it (an audio placeholder expanded to its frames).
            length = self.wanted[req_id] = self.runner.requests[req_id].num_prompt_tokens
            blocks = self.rows.setdefault(req_id, [[] for _ in self.layers])[slot]
            have = self.sent.get(req_id, 0) + sum(b.shape[0] for b in blocks)
            begin, end = int(starts[row]), int(starts[row + 1])
            # The rows' first position: a request recomputed after preemption runs
            # positions again that it already gave; those are skipped.
            first = int(batch.num_computed_tokens_cpu[row])
            stop = end - begin if req_id in self.every else min(end - begin, length - first)
            skip = max(0, have - first)
            if stop > skip:
                blocks.append(states[begin + skip : begin + stop].float().clone())

    def collect(self, req_id: str) -> tuple[tuple[int, ...], bytes] | None:
        """The request's states [layers, rows, H] not yet returned (shape and float32
        bytes): the prompt's once they are all in, then (``every``) each fed token's."""
        length = self.wanted.get(req_id)
        blocks = self.rows.get(req_id)
        if length is None or blocks is None:
            return None
        sent = self.sent.get(req_id, 0)
        counts = [sum(b.shape[0] for b in layer) for layer in blocks]
        if min(counts) == 0 or sent + min(counts) < length:
            return None
        stacked = self.torch.stack([self.torch.cat(layer) for layer in blocks])
        if req_id in self.every:
            self.rows[req_id] = [[] for _ in self.layers]
            self.sent[req_id] = sent + stacked.shape[1]
        else:
            self.forget(req_id)
        return tuple(stacked.shape), stacked.numpy().tobytes()

    def forget(self, req_id: str) -> None:
        self.wanted.pop(req_id, None)
        self.every.discard(req_id)
        self.rows.pop(req_id, None)
        self.sent.pop(req_id, None)


class _Worker:
    def __init__(self) -> None:
        self.engine: Any = None
        self.hooks: _StateHooks | None = None
        self.internal: dict[str, str] = {}  # our request id -> vLLM's
        self.external: dict[str, str] = {}
        self.step_s = 0.0  # in LLMEngine.step(), all steps
        self.forward_s = 0.0  # of which in the model's forward
        self._forward_started = 0.0

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        from vllm import EngineArgs, LLMEngine

        started = time.perf_counter()
        layers = args.pop("hidden_layers", None)
        compiled = bool(args.pop("compiled", False))
        audio = bool(args.pop("audio", False))
        engine_args = EngineArgs(
            enforce_eager=not compiled,  # compiled on a CPU: one Dynamo trace, inductor kernels
            # The multimodal processor (audio input) needs the checkpoint's tokenizer.
            skip_tokenizer_init=not audio,
            async_scheduling=False,  # outputs in the step that made them (on by default on GPUs)
            enable_prefix_caching=not layers,  # a cached prefix computes no hidden states
            limit_mm_per_prompt={"image": 0, "video": 0, "audio": 1 if audio else 0},
            **args,
        )
        try:
            self.engine = LLMEngine.from_engine_args(engine_args)
        except RuntimeError as exc:
            if audio and "Failed to load the processor" in str(exc):
                cause = f"{type(exc.__cause__).__name__}: {str(exc.__cause__)[:160]}"
                raise RuntimeError(
                    f"audio input needs the checkpoint's multimodal processor in {args['model']} "
                    f"(processor_config.json, the tokenizer's media tokens by name), which vLLM "
                    f"failed to build ({cause}...); remake a tiny checkpoint, or start "
                    "the thinker with audio_input: false"
                ) from exc
            raise
        if layers:
            self.hooks = _StateHooks(self.engine, list(layers))
        self._time_forwards()
        return {"start_s": time.perf_counter() - started}

    def _time_forwards(self) -> None:
        """Time the model's forward (vLLM internals, as ``_StateHooks``'s): what of a step
        is the model, and what vLLM's own Python around it."""
        core = self.engine.engine_core.engine_core
        model = core.model_executor.driver_worker.worker.model_runner.model

        def started(module: Any, args: Any) -> None:
            self._forward_started = time.perf_counter()

        def ended(module: Any, args: Any, output: Any) -> None:
            self.forward_s += time.perf_counter() - self._forward_started

        model.register_forward_pre_hook(started)
        model.register_forward_hook(ended)

    def add(
        self,
        request_id: str,
        prompt: list[int],
        params: dict[str, Any],
        states: bool | str,
        audio: tuple[Any, int] | None = None,
    ) -> None:
        """``states``: True, the prompt's hidden states; "every", each fed token's too.
        ``audio``: (float32 waveform, sample rate) for the prompt's one audio placeholder,
        which vLLM's multimodal processor expands to the audio's frames."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        # DELTA: each step's output holds that step's new tokens only
        sampling = SamplingParams(detokenize=False, output_kind=RequestOutputKind.DELTA, **params)
        inputs = TokensPrompt(prompt_token_ids=prompt)
        if audio is not None:
            inputs["multi_modal_data"] = {"audio": audio}
        internal = self.engine.add_request(request_id, inputs, sampling)
        internal = internal if isinstance(internal, str) else request_id
        self.internal[request_id], self.external[internal] = internal, request_id
        if states and self.hooks is not None:
            self.hooks.wanted[internal] = len(prompt)
            if states == "every":
                self.hooks.every.add(internal)

    def abort(self, request_ids: list[str]) -> int:
        """Abort; the requests the engine still holds."""
        known = [r for r in request_ids if r in self.internal]
        if known:
            self.engine.abort_request(known)
        for request_id in known:
            self._forget(request_id)
        return self.unfinished()

    def step(
        self,
    ) -> tuple[list[tuple[str, list[int], bool, str | None, Any]], int, tuple[float, float]]:
        """One engine step: each request's part, the requests the engine still holds, and
        the seconds in ``LLMEngine.step()`` and in the model's forward so far."""
        results = []
        started = time.perf_counter()
        outputs = self.engine.step()
        self.step_s += time.perf_counter() - started
        for out in outputs:
            request_id = out.request_id
            internal = self.internal.get(request_id, request_id)
            completion = out.outputs[0]
            states = None if self.hooks is None else self.hooks.collect(internal)
            new = list(completion.token_ids)
            reason = completion.finish_reason
            results.append((request_id, new, bool(out.finished), reason, states))
            if out.finished:
                self._forget(request_id)
        return results, self.unfinished(), (self.step_s, self.forward_s)

    def unfinished(self) -> int:
        """Requests the engine still holds (its scheduler's count)."""
        return int(self.engine.get_num_unfinished_requests())

    def _forget(self, request_id: str) -> None:
        internal = self.internal.pop(request_id, request_id)
        self.external.pop(internal, None)
        if self.hooks is not None:
            self.hooks.forget(internal)


def main() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # vLLM's prints must not land in the frame stream
    worker = _Worker()
    while True:
        frame = read_frame(stdin)
        if frame is None or frame[0] == "close":
            write_frame(stdout, ("ok", None))
            return 0
        command, arguments = frame
        try:
            result = getattr(worker, command)(*arguments)
        except Exception as exc:
            write_frame(stdout, ("error", type(exc).__name__, str(exc)))
        else:
            write_frame(stdout, ("ok", result))


if __name__ == "__main__":
    sys.exit(main())
