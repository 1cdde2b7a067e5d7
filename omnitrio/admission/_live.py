"""What the admission guards read off the live streams (``_guards.py``), scanned once
between the events that move it.

The lateness guard asks for the largest lag of a live stream, the startup guard for
the least time a playing stream it keeps has to its playback deadline and (with
``hold_startups``) how long a stream that plays audio has been on its way to its first
audio. A scan of the live streams answers all three; it is kept until a stage applies
a round (only a round puts audio, which moves them) or a stream ends or is released
(``moved``). An admission adds a stream with no audio yet, which moves none of them
but the last, so without ``hold_startups`` a burst of admissions between two rounds
scans once, not once each.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple

from .._stream import StreamState


class Scan(NamedTuple):
    most_lag_s: float
    """The live streams' largest lag at their latest audio (``StreamState.lag_s``)."""
    deadlines: list[float]
    """The playback deadlines (sorted) of the playing streams the startup guard keeps."""
    starting: list[float]
    """With ``hold_startups``: the first-audio deadlines (sorted) of the live streams that
    play audio and have none yet."""


class LiveStreams:
    """The guards' view of ``streams`` (the pipeline's live streams, by id; ``quiet``:
    the ids of those that play no audio)."""

    def __init__(
        self,
        streams: Mapping[str, StreamState],
        quiet: Collection[str],
        guards: Callable[[float], bool],
        first_audio_budget_s: float,
        *,
        hold_startups: bool = False,
    ) -> None:
        self._streams = streams
        self._quiet = quiet
        self._guards = guards
        self._budget_s = first_audio_budget_s
        self.hold_startups = hold_startups
        self._scan: Scan | None = None

    def moved(self) -> None:
        """A round was applied, or a stream ended or was released: scan again."""
        self._scan = None

    def admitted(self, plays_audio: bool) -> None:
        """A stream was admitted: one more on its way to its first audio, if it plays."""
        if self.hold_startups and plays_audio:
            self._scan = None

    def most_lag_s(self) -> float:
        """The largest lag of a live stream at its latest audio."""
        return self.scan().most_lag_s

    def least_slack_s(self) -> float:
        """The least time a live stream the startup guard keeps has to its playback
        deadline, not yet past (inf: none): one that has played audio, not longer than
        ``Startup.guards`` allows."""
        return _first_ahead(self.scan().deadlines, time.perf_counter())

    def oldest_start_s(self) -> float | None:
        """How long ago the first-admitted live stream that plays audio, has none yet and
        is within its first-audio budget was admitted (None: none)."""
        now_s = time.perf_counter()
        ahead_s = _first_ahead(self.scan().starting, now_s)
        return None if ahead_s == math.inf else self._budget_s - ahead_s

    def scan(self) -> Scan:
        """The live streams' ``Scan``, kept until ``moved``."""
        scan = self._scan
        if scan is None:
            hold, quiet, guards = self.hold_startups, self._quiet, self._guards
            most_lag_s = 0.0
            deadlines: list[float] = []
            starting: list[float] = []
            for stream in self._streams.values():
                if stream.ending:
                    continue
                if stream.first_audio_at_s is None:
                    if hold and stream.id not in quiet:
                        starting.append(stream.deadline_s)
                    continue
                most_lag_s = max(most_lag_s, stream.lag_s)
                if guards(stream.audio_s):
                    deadlines.append(stream.deadline_s)
            deadlines.sort()
            starting.sort()
            scan = self._scan = Scan(most_lag_s, deadlines, starting)
        return scan


def _first_ahead(deadlines: list[float], now_s: float) -> float:
    """The time from ``now_s`` to the first of the sorted ``deadlines`` not yet past
    (inf: none)."""
    index = bisect.bisect_left(deadlines, now_s)
    return deadlines[index] - now_s if index < len(deadlines) else math.inf
