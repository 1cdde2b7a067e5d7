"""Turning a stream's packaged pieces into the ``StreamOutput`` of one step."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from omnitrio import Event, StreamOutput, TextDelta, VisibleItem

from ._packaging import Packager, PackagingError


@dataclass
class Outbox:
    """Pieces collected for one stream but not yet handed on (over a step's limit)."""

    payloads: deque[object] = field(default_factory=deque)


def step_output(
    packager: Packager,
    stream_id: str,
    outbox: Outbox,
    *,
    computing: bool,
    can_continue: bool,
    max_payloads: int,
) -> StreamOutput:
    """This step's output for one stream.

    ``computing``: the stream still has model work (its last token is not sampled);
    only when it has none does this wait for its packaging. ``can_continue``: the
    stage can step it again without new input. Text pieces merge into one delta,
    events of one name into one event (their tuple fields concatenated).
    """
    texts: list[str] = []
    events: dict[str, dict[str, tuple[object, ...]]] = {}
    try:
        pieces = packager.collect(stream_id, wait=not computing)
    except PackagingError as exc:
        return StreamOutput(error=exc)
    for piece in pieces:
        outbox.payloads.extend(piece.payloads)
        for item in piece.visible:
            if isinstance(item, TextDelta):
                texts.append(item.text)
            elif isinstance(item, Event):
                merged = events.setdefault(item.name, {})
                for key, value in item.data.items():
                    assert isinstance(value, tuple)
                    merged[key] = merged.get(key, ()) + value
    payloads = tuple(
        outbox.payloads.popleft() for _ in range(min(max_payloads, len(outbox.payloads)))
    )
    visible: list[VisibleItem] = [TextDelta("".join(texts))] if any(texts) else []
    visible += [Event(name, data) for name, data in events.items()]  # type: ignore[arg-type]
    done = not computing and not outbox.payloads and packager.idle(stream_id)
    more = not done and (can_continue or bool(outbox.payloads) or not computing)
    return StreamOutput(payloads=payloads, visible=tuple(visible), more=more, done=done)
