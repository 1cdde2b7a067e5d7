"""Typed errors. Each message names the broken rule and, where there is one, the fix."""

from __future__ import annotations

from collections.abc import Sequence


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
