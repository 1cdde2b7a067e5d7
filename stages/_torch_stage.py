"""What the autoregressive model stages share: device, threads, packaging, statistics,
and failing one stream of a batch.

A subclass keeps its per-stream state in ``self.streams`` (objects with a ``kv``
attribute: its ``SlotKV`` in ``self.kv_slots``, the stage's batched KV cache, or
``None``) and its step timing in ``self.clock``;
what a step's packaging made waits in ``self.outboxes`` until the step limits allow.

A batched step does one forward for every stream, then each stream's own work
(sampling, its grammar). An error in a stream's own work is that stream's: run it
through ``per_stream`` and the error (one of ``STREAM_ERRORS``) is kept for the
stream, which the step then answers with ``failed(stream_id)`` (a ``StreamOutput``
carrying the error: the runtime fails that stream alone, with the stage named). Any
other exception escapes ``step`` and fails the whole batch, as it should: the
forward, the shared state, may be broken. The runtime counts those
(``num_step_failures``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from omnitrio import StreamOutput
from stages._grammar import GrammarError
from stages._packaging import Outbox, Packager
from stages._torch_device import stage_device
from stages._torch_kv import cache_nbytes
from stages._torch_sampling import OptionError, SamplingError
from stages._torch_slots import KVSlots, SlotKV
from stages._torch_timing import StepClock

T = TypeVar("T")

STREAM_ERRORS: tuple[type[Exception], ...] = (GrammarError, SamplingError, OptionError)
"""Errors of one stream's own work: a grammar that cannot continue, a sampling error
(probabilities that are not numbers), an option that does not fit."""


class AutoregressiveStage:
    def __init__(
        self, name: str, device: str, *, num_threads: int | None, packaging_queue: int
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide: set the same in every stage
        self.name = name
        self.device = stage_device(name, device)
        self.streams: dict[str, Any] = {}
        self.outboxes: dict[str, Outbox] = {}
        self.clock = StepClock()
        self.packager = Packager(f"omnitrio-{name}", max_queued_jobs=packaging_queue)
        self.failures: dict[str, Exception] = {}  # streams failed in this step
        self.kv_slots = KVSlots()

    def per_stream(self, stream_id: str, work: Callable[[], T]) -> T | None:
        """``work()``, one stream's part of a step. If it raises one of
        ``STREAM_ERRORS``, the error is kept for ``failed(stream_id)`` and the result is
        None: the stream drops out of this step, the others go on."""
        try:
            return work()
        except STREAM_ERRORS as exc:
            self.failures[stream_id] = exc
            return None

    def failed(self, stream_id: str) -> StreamOutput | None:
        """The output that fails ``stream_id`` (and only it), if its work failed in this
        step; None otherwise. Its state is freed when the runtime closes it."""
        error = self.failures.pop(stream_id, None)
        return None if error is None else StreamOutput(error=error)

    def close_stream(self, stream_id: str) -> None:
        self.failures.pop(stream_id, None)
        stream = self.streams.pop(stream_id, None)
        kv = getattr(stream, "kv", None)
        if isinstance(kv, SlotKV):
            kv.release()  # its slot goes back to the stage's KV cache
        self.outboxes.pop(stream_id, None)
        self.packager.drop(stream_id)

    def close(self) -> None:
        self.packager.close()

    def stage_statistics(self) -> Mapping[str, float]:
        streams = list(self.streams.values())
        return {
            **self.clock.snapshot(self.packager),
            "num_active_streams": len(streams),
            "kv_bytes": sum(cache_nbytes(s.kv) for s in streams if s.kv is not None),
        }


def constructor_signature(stage_class: type) -> inspect.Signature:
    """``stage_class.__init__``'s params without ``self``: what ``inspect.signature``
    of a class with a ``__new__`` (a stage whose ``engine`` param picks its class)
    shows once it is the class's ``__signature__``."""
    signature = inspect.signature(stage_class.__init__)
    return signature.replace(parameters=tuple(signature.parameters.values())[1:])
