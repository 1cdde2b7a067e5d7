"""Typed errors. Each message names the broken rule and, where there is one, the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal


class OmnitrioError(Exception):
    """Base class of every error omnitrio raises on purpose."""


class ConfigError(OmnitrioError):
    """A pipeline config is invalid. The message names the file, the key and the fix.

    A config is checked whole: ``also`` holds the other problems found in the same
    file (each a ``ConfigError`` of its own), so one run names them all; the message
    has one ``FILE: KEY: problem`` line for each."""

    def __init__(
        self, source: str, key: str, problem: str, also: Sequence[ConfigError] = ()
    ) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        self.also = tuple(also)
        lines = [f"{source}: {key}: {problem}", *(str(e) for e in self.also)]
        super().__init__("\n".join(lines))

    @classmethod
    def of_all(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """One error for ``problems`` (at least one): the first, with the rest as ``also``."""
        first, *rest = problems
        return cls(first.source, first.key, first.problem, (*first.also, *rest))

    def __reduce__(
        self,
    ) -> tuple[type[ConfigError], tuple[str, str, str, tuple[ConfigError, ...]]]:
        # Raised in a Ray-placed stage's process too: it pickles by its fields.
        return (ConfigError, (self.source, self.key, self.problem, self.also))


class Overloaded(OmnitrioError):
    """A new stream is refused (at once, or once ``pipeline.admission_wait_s`` ran out):
    the pipeline serves ``max_streams`` streams, or (``problem`` set) one more would push
    a stage below real time for every stream.

    ``retry_after_s``: when a retry may find room, from the stages' step-time models
    (HTTP sends it as ``Retry-After``), or None when there is no estimate.
    """

    def __init__(
        self, max_streams: int, retry_after_s: float | None = None, problem: str | None = None
    ) -> None:
        self.max_streams = max_streams
        self.retry_after_s = retry_after_s
        self.problem = problem
        retry = "retry later" if retry_after_s is None else f"retry in {retry_after_s:.1f} s"
        if problem is None:
            message = (
                f"pipeline is serving its max_streams={max_streams} streams; "
                f"{retry} or raise pipeline.max_streams in the config"
            )
        else:
            message = f"pipeline has no real-time headroom for another stream: {problem}; {retry}"
        super().__init__(message)

    def __reduce__(
        self,
    ) -> tuple[type[Overloaded], tuple[int, float | None, str | None]]:
        return (Overloaded, (self.max_streams, self.retry_after_s, self.problem))


class StreamShed(OmnitrioError):
    """An admitted stream was stopped to keep the others in real time: ``stage`` fell
    behind (it slowed down) and this stream was the newest, or the lowest ``priority``.

    Raised from the stream's iterator after the items made before it.
    """

    def __init__(self, stream_id: str, stage: str, problem: str) -> None:
        self.stream_id = stream_id
        self.stage = stage
        self.problem = problem
        super().__init__(
            f"stream {stream_id!r} was shed to keep the other streams in real time: {problem}"
        )


StageCall = Literal["open_stream", "step", "watchdog", "process"]
"""Where a stage failed a stream: its ``open_stream``, its ``step``, the watchdog (the
step hung), or its process (a Ray-placed stage's process was lost)."""


class StageError(OmnitrioError):
    """A stage failed the work of one stream.

    Raised from the stream's iterator. ``stage``, ``stream_id`` and ``during`` (a
    ``StageCall``) name where it happened, for code to read instead of the message;
    ``__cause__`` is the stage's own exception.
    """

    def __init__(
        self, stage: str, stream_id: str, problem: str, during: StageCall = "step"
    ) -> None:
        self.stage = stage
        self.stream_id = stream_id
        self.problem = problem
        self.during: StageCall = during
        super().__init__(f"stage {stage!r} failed stream {stream_id!r}: {problem}")


class StageLoadError(OmnitrioError):
    """A stage could not be constructed (weights missing, bad parameters, ...)."""

    def __init__(self, stage: str, problem: str) -> None:
        self.stage = stage
        self.problem = problem
        super().__init__(f"stage {stage!r} failed to load: {problem}")

    def __reduce__(self) -> tuple[type[StageLoadError], tuple[str, str]]:
        # Raised in a Ray-placed stage's process too: it pickles by its fields.
        return (StageLoadError, (self.stage, self.problem))


class PipelineClosed(OmnitrioError):
    """The pipeline stopped while the stream was still open."""

    def __init__(self, stream_id: str) -> None:
        self.stream_id = stream_id
        super().__init__(f"stream {stream_id!r} was open when its pipeline closed")
