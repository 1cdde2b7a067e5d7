"""The voice chat's real-time limit, and its admission against it (issue 41), for
``voice_latency.py --find-limit CAPS``.

The limit is the largest fixed cap at which every admitted answer stays continuous
for a client that buffers 200 ms. Each cap in ``CAPS`` is served on its own server:
the voice chat's config with ``pipeline.admission: max_streams`` and
``pipeline.max_streams`` at the cap, everything else as configured (the wait,
``pipeline.admission_wait_s``, included: a turn past the cap waits for a slot that
frees within it, else it is refused with a retry hint). Every conversation is one
client, whose share of the streams (``--max-streams-per-client``, by default half of
``max_streams``) is set to ``CLIENT_SHARE``: at the cap it refused past it at once,
before the pipeline's rule and its wait were asked. ``cpu`` in ``CAPS`` serves the
config as it is (its own admission, ``admission: cpu`` for the voice chat), and
``cpu:M`` the same with ``pipeline.realtime_margin`` at ``M`` (the cores' rule's
margin, ``omnitrio/admission/_cpu.py``). Each arm
runs the same level of conversations (more than the caps, so each cap binds), in the
order given: interleave them (``2,3,cpu,3,2``), one sitting, to compare them.

An answer is live at the server from its admission to its response.done; the client
sees it make audio from its first audio delta to its response.done. ``answers_at_once``
is the most answers making audio at once so (of the answers that were answered): under
a cap at most the cap (the time from admission to first audio, ~0.6-0.9 s, is not
counted: from the turn's speech_stopped a turn waiting for a slot counted, and a cap of
2 read 3), and for ``cpu`` what the rule admitted, less the answers still starting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from benchmarks.voice_latency import Level, Turn

OWN_ADMISSION = "cpu"
"""The arm that serves the config's own admission."""
CLIENT_SHARE = 64
"""A capped arm's client share: above any cap tried, so the cap and its wait decide."""


Spec = tuple[int | None, float | None]
"""An arm: its cap (None: the config's own admission) and that admission's margin (None:
the config's)."""


def parse_caps(text: str) -> list[Spec]:
    """``2,3,cpu,cpu:0.5`` -> ``[(2, None), (3, None), (None, None), (None, 0.5)]``."""
    specs: list[Spec] = []
    for word in text.split(","):
        word = word.strip()
        own, _, margin = word.partition(":")
        if word == OWN_ADMISSION:
            specs.append((None, None))
        elif own == OWN_ADMISSION and margin.replace(".", "", 1).isdigit():
            specs.append((None, float(margin)))
        elif word.isdigit() and int(word) >= 1:
            specs.append((int(word), None))
        else:
            raise ValueError(
                f"a cap is a whole number >= 1, {OWN_ADMISSION!r} or {OWN_ADMISSION}:MARGIN, "
                f"not {word!r}"
            )
    return specs


def capped_config(config: dict[str, Any], cap: int) -> dict[str, Any]:
    """``config`` (a parsed pipeline YAML) admitting by ``max_streams`` alone, at ``cap``."""
    pipeline = {**config.get("pipeline", {}), "max_streams": cap, "admission": "max_streams"}
    return {**config, "pipeline": pipeline}


def _write(config: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def server_args(source: Path, spec: Spec, folder: Path) -> list[str]:
    """``omnitrio run``'s arguments for one arm: the capped config and a client's share
    above the cap, the config with the margin, or the config as it is."""
    cap, margin = spec
    share = ["--max-streams-per-client", str(max(cap or 0, CLIENT_SHARE))]  # every arm alike
    if cap is None and margin is None:
        return ["--config", str(source), *share]
    config = yaml.safe_load(source.read_text(encoding="utf-8"))
    if cap is None:
        config["pipeline"] = {**config.get("pipeline", {}), "realtime_margin": margin}
        return ["--config", str(_write(config, folder / f"margin-{margin}.yaml")), *share]
    path = _write(capped_config(config, cap), folder / f"capped-{cap}.yaml")
    return ["--config", str(path), *share]


def answered(turns: Sequence[Turn]) -> list[Turn]:
    return [t for t in turns if t.status == "completed" and t.answer_audio_s > 0]


def answers_at_once(turns: Sequence[Turn]) -> int:
    """The most answers making audio at once (first audio to response.done, the module's
    view)."""
    edges: list[tuple[float, int]] = []
    for turn in answered(turns):
        start, end = turn.clock_s.get("first_audio"), turn.clock_s.get("done")
        if start is not None and end is not None and end > start:
            edges += [(start, 1), (end, -1)]
    most = live = 0
    for _, step in sorted(edges):  # an end before a start at the same instant
        live += step
        most = max(most, live)
    return most


@dataclass
class Arm:
    """One arm's level: ``cap`` None is the config's own admission (``margin``: with
    ``pipeline.realtime_margin`` at it)."""

    cap: int | None
    level: Level
    margin: float | None = None

    @property
    def name(self) -> str:
        if self.cap is not None:
            return f"max_streams {self.cap}"
        return OWN_ADMISSION if self.margin is None else f"{OWN_ADMISSION}, margin {self.margin:g}"

    @property
    def num_dry(self) -> int:
        return sum(t.underrun_buffered_s > 0 for t in answered(self.level.turns))

    @property
    def continuous(self) -> bool:
        return bool(answered(self.level.turns)) and self.num_dry == 0


def limit(arms: Sequence[Arm]) -> int | None:
    """The largest cap whose every run kept every answer continuous and below which no
    run of a tried cap ran one dry (None: none did). A cap counts only where it bound:
    below the conversations, and some run of it had that many answers at once."""
    caps = sorted({a.cap for a in arms if a.cap is not None})
    found = None
    for cap in caps:
        runs = [a for a in arms if a.cap == cap]
        if not all(a.continuous for a in runs):
            break
        if any(cap < a.level.conversations and answers_at_once(a.level.turns) >= cap for a in runs):
            found = cap
    return found


def _p50_ms(turns: Sequence[Turn]) -> str:
    values = sorted(
        t.end_of_speech_to_first_audio_s * 1000
        for t in answered(turns)
        if t.end_of_speech_to_first_audio_s is not None
    )
    if not values:
        return "-"
    middle = (len(values) - 1) / 2
    return f"{(values[math.floor(middle)] + values[math.ceil(middle)]) / 2:.0f}"


def limit_report(arms: Sequence[Arm]) -> str:
    """A row an arm, in the order run, then the limit and the own admission against it."""
    lines = [
        "| arm | conversations | answered / refused (with a retry hint) | answers at once, most "
        "| first audio p50 (ms) | dry, no buffer (s) | dry, 200 ms buffer (s) | continuous "
        "| other processes' CPU (cores) | load (start, end) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        turns, level = arm.level.turns, arm.level
        done = answered(turns)
        refused = [t for t in turns if t.status == "failed"]
        hinted = sum(t.retry_after_ms is not None for t in refused)
        others = level.others_cpu_s / level.wall_s if level.wall_s else math.nan
        lines.append(
            f"| {arm.name} | {level.conversations} | {len(done)} / {len(refused)} ({hinted}) "
            f"| {answers_at_once(turns)} | {_p50_ms(turns)} "
            f"| {sum(t.underrun_s > 0 for t in done)} ({sum(t.underrun_s for t in done):.2f}) "
            f"| {arm.num_dry} ({sum(t.underrun_buffered_s for t in done):.2f}) "
            f"| {'yes' if arm.continuous else 'no'} | {others:.2f} "
            "| {:.1f}, {:.1f} |".format(*level.load_average)
        )
    found = limit(arms)
    lines.append("")
    if found is None:
        lines.append("Limit: no cap tried kept every answer continuous.")
    else:
        lines.append(f"Limit: {found} answers at once (the largest cap tried with none dry).")
    for arm in (a for a in arms if a.cap is None):
        at_once = answers_at_once(arm.level.turns)
        capped = [len(answered(a.level.turns)) for a in arms if found and a.cap == found]
        against = f"; the limit's runs answered {capped}" if capped else ""
        lines.append(
            f"{arm.name}: answered {len(answered(arm.level.turns))} of "
            f"{len(arm.level.turns)} turns, at most {at_once} at once (limit {found}), "
            f"{arm.num_dry} dry for a 200 ms client{against}."
        )
    return "\n".join(lines)
