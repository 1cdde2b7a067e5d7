"""Stages that break the stage protocol on purpose, to test the runtime's guards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from omnitrio import Event, Request, StreamOutput, StreamWork, TextDelta


class _Base:
    max_inputs_per_step: int | None = None
    max_payloads_per_step = 1
    max_visible_per_step = 1

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.name = name

    def open_stream(self, stream_id: str, request: Request) -> None:
        pass

    def close_stream(self, stream_id: str) -> None:
        pass

    def close(self) -> None:
        pass


class LeakyStage(_Base):
    """Puts an edge payload among its user-visible items."""

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        payload = {"hidden_states": [0.0] * 16}
        return {w.stream_id: StreamOutput(visible=(payload,), done=True) for w in batch}  # type: ignore[arg-type]


class StuckStage(_Base):
    """Answers neither ``more`` nor ``done`` once its input has closed."""

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        return {w.stream_id: StreamOutput(visible=(TextDelta("x"),)) for w in batch}


class ChattyStage(_Base):
    """Emits more visible items in one step than it declared."""

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        visible = (TextDelta("1"), TextDelta("2"))
        return {w.stream_id: StreamOutput(visible=visible, done=True) for w in batch}


class NotAStage:
    def __init__(self, name: str, device: str = "cpu") -> None:
        self.name = name


class MalformedStage(_Base):
    """Breaks the shape of StreamOutput for streams whose request asks it to."""

    def __init__(self, name: str, device: str = "cpu") -> None:
        super().__init__(name)
        self.modes: dict[str, object] = {}

    def open_stream(self, stream_id: str, request: Request) -> None:
        self.modes[stream_id] = request.options.knobs.get("mode")

    def close_stream(self, stream_id: str) -> None:
        del self.modes[stream_id]

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        outputs: dict[str, object] = {}
        for work in batch:
            mode = self.modes[work.stream_id]
            if mode == "none-payloads":
                outputs[work.stream_id] = StreamOutput(payloads=None, done=True)  # type: ignore[arg-type]
            elif mode == "string-error":
                outputs[work.stream_id] = StreamOutput(error="bad input")  # type: ignore[arg-type]
            elif mode == "not-an-output":
                outputs[work.stream_id] = "done"
            else:
                outputs[work.stream_id] = StreamOutput(visible=(TextDelta("ok"),), done=True)
        outputs["no-such-stream"] = StreamOutput(done=True)
        return outputs  # type: ignore[return-value]


class HiddenInEventStage(_Base):
    """Tries to smuggle an inter-stage object to the client inside an event."""

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        hidden = object()  # stands for a hidden-state tensor
        event = Event("e", {"hidden": hidden})  # type: ignore[dict-item]
        return {w.stream_id: StreamOutput(visible=(event,), done=True) for w in batch}


class LimitsOnLoadStage:
    """Declares no limits on its class: they are known only once it is built."""

    max_inputs_per_step: int | None = None

    def __init__(self, name: str, device: str = "cpu", *, max_payloads_per_step: int = 1) -> None:
        self.name = name
        self.max_payloads_per_step = max_payloads_per_step
        self.max_visible_per_step = 1

    def open_stream(self, stream_id: str, request: Request) -> None:
        pass

    def step(self, batch: Sequence[StreamWork]) -> Mapping[str, StreamOutput]:
        return {w.stream_id: StreamOutput(visible=(TextDelta("x"),), done=True) for w in batch}

    def close_stream(self, stream_id: str) -> None:
        pass

    def close(self) -> None:
        pass
