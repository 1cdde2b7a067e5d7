"""Typed errors. Each message names the broken rule and, where there is one, the fix."""

from __future__ import annotations


class OmnitrioError(Exception):
    """Base class of every error omnitrio raises on purpose."""


class ConfigError(OmnitrioError):
    """A pipeline config is invalid. The message names the file, the key and the fix."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(f"{source}: {key}: {problem}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str]]:
        # Raised in a Ray-placed stage's process too: it pickles by its fields.
        return (ConfigError, (self.source, self.key, self.problem))


class Overloaded(OmnitrioError):
    """The pipeline already serves ``max_streams`` streams; a new one is refused at once."""

    def __init__(self, max_streams: int) -> None:
        self.max_streams = max_streams
        super().__init__(
            f"pipeline is serving its max_streams={max_streams} streams; "
            "retry later or raise pipeline.max_streams in the config"
        )


class StageError(OmnitrioError):
    """A stage failed the work of one stream.

    Raised from the stream's iterator. ``stage`` and ``stream_id`` name where it
    happened; ``__cause__`` is the stage's own exception.
    """

    def __init__(self, stage: str, stream_id: str, problem: str) -> None:
        self.stage = stage
        self.stream_id = stream_id
        self.problem = problem
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
