"""Why an answer's audio came late: the TTS's parts (``--trace``), each blamed on what
held it.

With tracing on, the TTS stage logs every audio part it makes (stages/voice/trace.py
``part``): when its synthesis started and ended, when the answer's audio made before
it runs out (played from its first audio on, in real time), when its text was complete
at the TTS, when that text had left the LLM stage and when the answer's previous part
was made. A part is late for a client that buffers ``buffer_s`` when it is made after
that audio plus ``buffer_s``. Its lateness is blamed on the longest of four waits, one
after the other: the text (the LLM wrote its phrase's last piece after the previous
part was made), the delivery (the LLM had handed that piece on, but the TTS stage had
it only later: its steps for other answers, and the round the runtime had queued
behind the running one without this answer), the queue (ready, but the TTS stage was
busy with other parts or answers) and the synthesis itself. A trace without the LLM's
time (``written``) blames what was the delivery on the text. ``late_list`` lists the late
parts one by one, with how long their answer held its tokens (first_audio.py's
``voice-held`` lines) since its previous part, and the other parts the TTS made while
its text was on the way or queued (``behind``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PART = re.compile(r"voice-part (\S+) (\S+) (.*)$", re.MULTILINE)
CAUSES = ("text", "delivery", "queue", "synthesis")


@dataclass(frozen=True)
class Part:
    kind: str  # "first" (the answer's first audio) or "next"
    stream_id: str
    start_s: float  # synthesis started (monotonic clock)
    end_s: float  # ... and ended: the part is made
    runs_out_s: float  # when the answer's audio made before it runs out
    text_s: float  # when its phrase's text was complete (0: a phrase already begun)
    previous_s: float  # when the answer's previous part was made
    audio_s: float
    written_s: float = 0.0  # when its phrase's last piece left the LLM (0: not known)


def parts(log_text: str) -> list[Part]:
    out = []
    for kind, stream_id, fields in PART.findall(log_text):
        v = {k: float(x) for k, x in (kv.split("=") for kv in fields.split())}
        out.append(
            Part(
                kind,
                stream_id,
                v["start"],
                v["end"],
                v["runs_out"],
                v["text"],
                v["prev"],
                v["audio"],
                v.get("written", 0.0),
            )
        )
    return out


def waits(part: Part) -> tuple[float, float, float, float]:
    """A part's four waits, one after the other (s): its text, its delivery, the queue
    and its synthesis (``CAUSES``)."""
    written = part.written_s or part.text_s  # not known: all of it the text's
    text = max(0.0, min(written, part.text_s) - part.previous_s)
    delivery = max(0.0, part.text_s - max(written, part.previous_s))
    queue = part.start_s - max(part.previous_s, part.text_s)
    synthesis = part.end_s - part.start_s
    return text, delivery, queue, synthesis


def blame(part: Part) -> str:
    """What held a late part longest: its text, its delivery, the queue, or its
    synthesis."""
    return max(zip(waits(part), CAUSES, strict=True))[1]


HELD = re.compile(r"voice-held (\S+) ([\d.]+) ([\d.]+)")


def held(log_text: str) -> dict[str, list[tuple[float, float]]]:
    """Each answer's holds (first_audio.py, ``voice-held`` lines): since and until when
    it held its next token while another answer's first audio was on its way."""
    out: dict[str, list[tuple[float, float]]] = {}
    for stream_id, since, until in HELD.findall(log_text):
        out.setdefault(stream_id, []).append((float(since), float(until)))
    return out


def late_list(log_text: str, start_s: float, end_s: float, buffer_s: float) -> list[str]:
    """One line for each later part made between ``start_s`` and ``end_s`` too late for
    a client that buffers ``buffer_s``: its answer, which of its parts it was, how late,
    its four waits, and how long its answer held its tokens since its previous part."""
    found = parts(log_text)
    holds = held(log_text)
    lines = []
    for part in found:
        late_s = part.end_s - (part.runs_out_s + buffer_s)
        if part.kind != "next" or not start_s <= part.end_s <= end_s or late_s <= 0:
            continue
        index = [p for p in found if p.stream_id == part.stream_id].index(part)
        spent = " / ".join(f"{cause} {s:.2f}" for cause, s in zip(CAUSES, waits(part), strict=True))
        held_s = sum(
            max(0.0, min(until, part.end_s) - max(since, part.previous_s))
            for since, until in holds.get(part.stream_id, [])
        )
        lines.append(
            f"{part.stream_id} part {index + 1}: {late_s:.2f} s late; waited {spent} s;"
            f" its tokens held {held_s:.2f} s{behind(part, found)}"
        )
    return lines


def behind(part: Part, found: list[Part]) -> str:
    """What the TTS synthesised while ``part``'s text was on its way to it or queued
    there (from when its last piece left the LLM, or its previous part was made, to its
    own start): each other part with its answer, kind and synthesis time, or ""."""
    since = max(part.written_s or part.text_s, part.previous_s)
    meanwhile = [
        f"{p.stream_id} {p.kind} {p.end_s - p.start_s:.2f}"
        for p in found
        if p is not part and p.end_s > since and p.start_s < part.start_s
    ]
    return f"; the TTS meanwhile: {', '.join(meanwhile)}" if meanwhile else ""


@dataclass(frozen=True)
class Lateness:
    num_parts: int  # later parts made in the window
    late: dict[str, tuple[int, float]]  # cause: (parts, seconds late in all)


def lateness(found: list[Part], start_s: float, end_s: float, buffer_s: float) -> Lateness:
    """The later parts made between ``start_s`` and ``end_s``, the late ones by cause."""
    later = [p for p in found if p.kind == "next" and start_s <= p.end_s <= end_s]
    late: dict[str, tuple[int, float]] = dict.fromkeys(CAUSES, (0, 0.0))
    for part in later:
        late_s = part.end_s - (part.runs_out_s + buffer_s)
        if late_s > 0:
            count, total = late[blame(part)]
            late[blame(part)] = (count + 1, total + late_s)
    return Lateness(len(later), late)
