"""The Realtime WebSocket endpoint: a thin shell around the sans-io ``RealtimeSession``.

One connection is one nursery: a reader task feeding client frames to the session,
a writer task sending server events, and one task per active response reading its
pipeline stream. Server events pass through a bounded queue, so a client that
reads slowly stops its response's reads from the pipeline (its stream's credits
run out). If the queue stays full for ``send_timeout_s`` the connection is closed
with code 1008; a client that reads nothing at all cannot even take the close
frame, and the HTTP server drops its TCP connection after the same timeout (see
``_serve._ContainedTCPServer``). Either way the response's stream is freed and no
other connection notices.

Speculative answers: the session decides them (omnitrio/realtime/_speculation.py);
this shell only runs them. On ``Speculate`` it opens the request's stream at once
and keeps its items in a bounded channel; on ``DropSpeculation`` it closes that
stream (it frees itself in the background); a ``StartResponse`` naming the
speculation reads the kept items first and then the rest of its stream. A
speculation that failed, or one named while the server drains, is dropped and the
response opens its own stream. So nothing is sent for a turn that is not confirmed,
and the answer to a confirmed one starts up to ``silence_duration_ms - pause_ms``
earlier.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import trio

from .._errors import OmnitrioError, Overloaded, StreamShed
from .._items import AudioChunk, Request, VisibleItem
from .._stream import Stream
from .._trace import mark
from ..realtime import (
    CancelResponse,
    DropSpeculation,
    Framing,
    Output,
    RealtimeSession,
    ServerEvent,
    SessionConfig,
    SideStageAudio,
    Speculate,
    StartResponse,
    StopPlayback,
    new_id,
)
from ..tools import remember_verdicts
from ._audio import resample_pcm16
from ._capabilities import pipeline_voices, transcription_model
from ._client_totals import SessionRefused, SessionTotals
from ._precheck import may_carry_tools, tool_verdicts
from ._shares import ShareExceeded
from ._side_stage import SessionSideStream
from ._state import Busy, Draining, ResponseLog, ServerState, retry_after_s

logger = logging.getLogger(__name__)

CLOSE_GOING_AWAY = 1001
CLOSE_TOO_SLOW = 1008
CLOSE_TRY_AGAIN_LATER = 1013


class _ClientTooSlow(Exception):
    pass


SPECULATION_BUFFER_ITEMS = 16
"""Items a speculative answer keeps before the turn ends (then it waits)."""


@dataclass
class _Speculation:
    """A response run ahead of its turn's end: its stream's items, kept until it is taken
    over by a response or dropped (see the module docstring)."""

    speculation_id: str
    request: Request
    items: trio.MemoryReceiveChannel[VisibleItem]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)  # the reading
    waiting: trio.CancelScope = field(default_factory=trio.CancelScope)  # the admission wait
    closed: trio.Event = field(default_factory=trio.Event)  # the stream is freed everywhere
    error: OmnitrioError | None = None  # what ended the stream, if not its end


class Transport(Protocol):
    """Where a session's events travel: the WebSocket (quart's), or a WebRTC call's
    data channel (omnitrio/webrtc/_link.py). ``receive`` raises when the peer has gone."""

    async def receive(self) -> str | bytes | None: ...

    async def send(self, data: str | bytes) -> None: ...

    async def close(self, code: int, reason: str = "") -> None: ...


class Media(Protocol):
    """The audio of a WebRTC call, which the server plays and hears itself (a WebSocket
    client sends and plays PCM in events instead)."""

    async def heard(self) -> bytes: ...

    async def play(self, item_id: str, pcm16: bytes, rate_hz: int) -> None: ...

    async def end_item(self, item_id: str) -> None: ...

    def stop_playing(self) -> tuple[str | None, int]: ...

    async def wait_played_out(self) -> None: ...


AUDIO_DELTAS = frozenset({"response.output_audio.delta", "response.audio.delta"})
"""On a WebRTC call the answer's audio goes out on the track, not in these events."""


class RealtimeConnection:
    """One accepted Realtime connection: a WebSocket, or a WebRTC call (``media``)."""

    def __init__(
        self,
        state: ServerState,
        ws: Transport,
        session: RealtimeSession,
        client: str,
        media: Media | None = None,
    ) -> None:
        self._state = state
        self._client = client  # whose share its responses count in (``_shares.py``)
        self._ws = ws
        self._media = media
        self._playing: dict[str, str] = {}  # WebRTC: item id -> the response it is of
        self._session = session
        self._send, self._outbound = trio.open_memory_channel[ServerEvent](
            state.settings.outbound_capacity
        )
        # A response's cancel scopes: the admission wait's, then the reading's.
        self._responses: dict[str, tuple[trio.CancelScope, trio.CancelScope]] = {}
        self._detector: SessionSideStream | None = None
        self._speculation: _Speculation | None = None
        self._totals: SessionTotals | None = None  # its part in the client's totals
        self._unsent = 0  # events queued and not yet handed to the transport
        self._ending = False  # end_when_quiet: the session ends once nothing is under way
        self._ended_quiet = False  # it did end so (not by the client, a limit or a stall)
        self._quiet = trio.Event()  # set (and replaced) as the connection may have gone quiet

    async def run(self) -> None:
        """Serve until the client leaves, the session limit passes or the client stalls."""
        settings = self._state.settings
        too_slow = False
        # A WebSocket session holds the server's key (checked before it was accepted);
        # a WebRTC call is counted by key in the calls endpoint (_calls.py), not here.
        key = settings.api_key if self._media is None else None
        try:
            self._totals = self._state.totals.open_session(self._client, key)
        except SessionRefused as refused:
            await self._refuse_session(refused)
            return
        self._state.sessions.add(self)  # a drain ends it once quiet (ServerState.drain)
        if self._state.draining:
            self.end_when_quiet()
        try:
            with trio.move_on_after(settings.max_session_s) as session_limit:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write)
                    for event in self._session.start():
                        await self._queue(event)
                    if self._media is not None:
                        nursery.start_soon(self._hear, nursery, self._media)
                    nursery.start_soon(self._end_when_quiet, nursery.cancel_scope)
                    await self._read(nursery)
                    nursery.cancel_scope.cancel()
        except* _ClientTooSlow:
            too_slow = True
        finally:
            self._state.sessions.discard(self)
            self._totals.close()
            if self._detector is not None:
                self._detector.close()
        if too_slow:
            await self._close(
                CLOSE_TOO_SLOW, f"client read nothing for {settings.send_timeout_s} s"
            )
        elif session_limit.cancelled_caught:
            await self._close(1008, f"session length limit of {settings.max_session_s} s reached")
        elif self._ended_quiet and self._media is None:  # (a call's close is the calls')
            await self._close(CLOSE_GOING_AWAY, "server draining; retry on another server")

    def answering(self) -> bool:
        """A response runs (or waits for admission), an answer's audio still plays (a
        call's), or events wait to go out to the client."""
        return bool(self._responses or self._playing or self._unsent)

    def end_when_quiet(self) -> None:
        """End the session (``run`` returns) once it is not ``answering``: at once where
        it is idle, else after its answer's last event (and, on a call, its audio) has
        gone out. A response still waiting for admission is refused (draining); what
        the client asks for meanwhile is answered as usual (a draining server refuses
        new responses). The server's drain asks it of every session
        (``ServerState.drain``); a WebSocket is then closed with 1001 (going away), a
        call's peer connection by the calls (``_calls.py``)."""
        self._ending = True
        for waiting, _ in self._responses.values():
            waiting.cancel()  # a response still waiting for admission is refused (draining)
        self._stir()

    def _stir(self) -> None:
        """Wake ``_end_when_quiet`` to look again (only where it waits)."""
        if self._ending:
            self._quiet.set()

    async def _end_when_quiet(self, scope: trio.CancelScope) -> None:
        while not self._ending or self.answering():
            await self._quiet.wait()
            self._quiet = trio.Event()
        self._ended_quiet = True
        scope.cancel()

    async def _read(self, nursery: trio.Nursery) -> None:
        idle, totals = self._state.idle_sessions, self._totals
        assert totals is not None
        while True:
            with idle.waiting() as waiting:
                frame = await self._ws.receive()
            if waiting.cancelled_caught:  # idle on a crowded server (_idle_sessions.py)
                if self._media is not None or self._responses:
                    continue  # a call's media, or an answer, is still going
                idle.num_closed += 1
                reason = f"idle {idle.crowded_idle_s:g} s while the server is near its limit"
                await self._close(CLOSE_TRY_AGAIN_LATER, reason)
                return
            refusal = None if frame is None else totals.refusal(frame, self._session.config)
            if refusal is not None:  # past the client's total (_client_totals.py) ...
                totals.update(self._session.held_bytes())  # ... unless a response used some
                refusal = totals.refusal(frame, self._session.config)  # type: ignore[arg-type]
            if refusal is not None:
                await self._queue(refusal)
                continue
            if may_carry_tools(frame):  # compile its tools off the loop first (_precheck.py)
                assert frame is not None
                check = partial(tool_verdicts, frame, self._session.config)
                shares = self._state.shares
                remember_verdicts(await shares.off_loop(self._client, check, wait=True))
            # quart hands an empty binary frame over as None; it is still a frame.
            await self._dispatch(nursery, self._session.receive(b"" if frame is None else frame))
            totals.update(self._session.held_bytes())

    async def _hear(self, nursery: trio.Nursery, media: Media) -> None:
        """A WebRTC call's microphone, into the session as it comes."""
        while True:
            await self._dispatch(nursery, self._session.hear(await media.heard()))
            if self._totals is not None:
                self._totals.update(self._session.held_bytes())

    async def _stop_playback(self, media: Media) -> None:
        """Barge-in, or output_audio_buffer.clear: the track goes silent now, and the
        item's transcript is cut to what went out."""
        item_id, played_ms = media.stop_playing()
        if item_id is None:
            return
        response_id = self._playing.pop(item_id, None)
        await self._queue(ServerEvent("output_audio_buffer.cleared", {"response_id": response_id}))
        for event in self._session.played(item_id, played_ms):
            await self._queue(event)

    async def _dispatch(self, nursery: trio.Nursery, outs: Sequence[Output]) -> None:
        """Do what the session asks: send events, start or cancel responses, listen."""
        for out in outs:
            if isinstance(out, ServerEvent):
                await self._queue(out)
            elif isinstance(out, StartResponse):
                await nursery.start(self._respond, nursery, out)
            elif isinstance(out, CancelResponse) and out.response_id in self._responses:
                for scope in self._responses[out.response_id]:
                    scope.cancel()
            elif isinstance(out, SideStageAudio):
                self._listen(nursery, out)
            elif isinstance(out, Speculate):
                self._speculate(nursery, out)
            elif isinstance(out, DropSpeculation):
                self._drop_speculation(out.speculation_id)
            elif isinstance(out, StopPlayback) and self._media is not None:
                await self._stop_playback(self._media)
        detector = self._detector
        if detector is not None and detector.generation != self._session.listening_generation:
            detector.close()  # turn detection was switched off or restarted: free it now
            self._detector = None

    def _listen(self, nursery: trio.Nursery, out: SideStageAudio) -> None:
        side_stage = self._state.side_stage
        if side_stage is None:
            raise RuntimeError("the session asked for turn detection, but there is no detector")
        if self._detector is None or self._detector.generation != out.generation:
            if self._detector is not None:
                self._detector.close()
            self._detector = side_stage.open(out.generation, out.options)
            nursery.start_soon(self._turns, nursery, self._detector)
        self._detector.append(out.pcm16)

    async def _turns(self, nursery: trio.Nursery, detector: SessionSideStream) -> None:
        """Feed the detector's findings to the session (barge-in, commit, response)."""
        async for event in detector:
            session, generation = self._session, detector.generation
            start_ms = event.data.get("audio_start_ms")
            end_ms = event.data.get("audio_end_ms")
            outs: Sequence[Output] = ()
            if event.name == "speech_started" and isinstance(start_ms, int):
                outs = session.speech_started(generation, start_ms)
            elif event.name == "speech_stopped" and isinstance(end_ms, int):
                outs = session.speech_stopped(generation, end_ms)
            elif event.name == "speech_paused" and isinstance(end_ms, int):
                outs = session.speech_paused(generation, end_ms)
            elif event.name == "speech_resumed":
                outs = session.speech_resumed()
            await self._dispatch(nursery, outs)
        if detector.failure is not None:
            failed = self._session.turn_detection_failed(detector.generation, detector.failure)
            await self._dispatch(nursery, failed)

    def _speculate(self, nursery: trio.Nursery, out: Speculate) -> None:
        """Run the speculation's request, unseen (none while draining)."""
        self._drop_speculation(None)  # the session drops the one before first; this is a guard
        if self._state.draining:
            return
        # Bounded, as every edge is: a speculation nobody takes yet holds its stream at
        # this many items, and the pipeline's own backpressure holds the stages.
        send, receive = trio.open_memory_channel[VisibleItem](SPECULATION_BUFFER_ITEMS)
        speculation = _Speculation(out.speculation_id, out.request, receive)
        self._speculation = speculation
        nursery.start_soon(self._run_speculation, speculation, send)

    async def _run_speculation(
        self, speculation: _Speculation, send: trio.MemorySendChannel[VisibleItem]
    ) -> None:
        try:
            # As in _respond: a cancel stops only the reading; leaving the block then
            # waits until every stage has freed the stream, and ``closed`` says so.
            with send:
                async with AsyncExitStack() as opened:
                    stream = await self._open(opened, speculation.waiting, speculation.request)
                    if stream is not None:
                        with speculation.scope:
                            async for item in stream:
                                await send.send(item)
        except OmnitrioError as exc:
            speculation.error = exc
        finally:
            speculation.closed.set()

    def _drop_speculation(self, speculation_id: str | None) -> None:
        """Close the speculative stream (``speculation_id``'s; None: whichever runs), if
        one runs (it frees itself in the background)."""
        speculation = self._speculation
        if speculation is not None and speculation_id in (None, speculation.speculation_id):
            speculation.waiting.cancel()
            speculation.scope.cancel()
            self._speculation = None
            self._state.speculations.labels("dropped").inc()

    def _take_speculation(self, start: StartResponse) -> _Speculation | None:
        """The speculation ``start`` takes over, if it runs and has not failed (else it
        is dropped, and the response opens its own stream)."""
        speculation = self._speculation
        if speculation is None:
            return None
        if (
            speculation.speculation_id != start.speculation_id
            or speculation.error is not None
            or self._state.draining
        ):
            self._drop_speculation(None)
            return None
        self._speculation = None
        self._state.speculations.labels("taken").inc()
        return speculation

    async def _write(self) -> None:
        async for event in self._outbound:
            await self._ws.send(self._session.encode(event))
            self._unsent -= 1
            if not self._unsent:
                self._stir()

    async def _queue(self, event: ServerEvent) -> None:
        """Queue a server event; a client that lets the queue stay full is too slow."""
        try:  # the queue has room (the client reads): no timeout scope, no checkpoints
            self._send.send_nowait(event)
            self._unsent += 1
            return
        except trio.WouldBlock:
            pass
        with trio.move_on_after(self._state.settings.send_timeout_s) as waited:
            await self._send.send(event)
            self._unsent += 1
        if waited.cancelled_caught:
            raise _ClientTooSlow

    async def _open(
        self, opened: AsyncExitStack, waiting: trio.CancelScope, request: Request
    ) -> Stream | None:
        """``request``'s stream, entered on ``opened``; None if ``waiting`` was cancelled
        while admission held the request (pipeline.admission_wait_s: nothing opened).
        Only the wait is in ``waiting``: once admitted, leaving ``opened`` still waits
        for every stage to free the stream."""
        with waiting:
            return await opened.enter_async_context(self._state.open_stream(self._client, request))
        return None

    async def _respond(
        self,
        nursery: trio.Nursery,
        start: StartResponse,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one response. A cancel stops only the reading: the stream is then closed
        and released in every stage *before* response.done goes out, so the client's
        next response.create finds its admission slot free (barge-in)."""
        rid = start.response_id
        status, error = "completed", None
        retry_s: float | None = None  # a refused or shed response: when to ask again
        log = ResponseLog(self._state, "realtime", rid)
        busy: Busy | None = None
        waiting = trio.CancelScope()  # a cancel while admission holds the request ends the wait
        reading = trio.CancelScope()
        self._responses[rid] = (waiting, reading)
        speculation = self._take_speculation(start)
        task_status.started()
        try:
            busy = self._state.busy()
            if busy == "draining":  # (a full pipeline: open_stream refuses, with its hint)
                raise self._state.refuse(busy)
            if speculation is not None:
                with reading:
                    await self._forward(rid, speculation.items, log)
                speculation.waiting.cancel()  # no-ops unless the reading was cancelled
                speculation.scope.cancel()
                await speculation.closed.wait()
                if speculation.error is not None:
                    raise speculation.error
            else:
                async with AsyncExitStack() as opened:
                    stream = await self._open(opened, waiting, start.request)
                    if stream is not None:
                        with reading:
                            await self._forward(rid, stream, log)
        except Overloaded as exc:
            if busy != "draining":  # counted by refuse
                self._state.refusals.labels("overloaded").inc()
            status, error, retry_s = "failed", str(exc), retry_after_s(exc)
        except StreamShed as exc:
            # The pipeline's estimate of when a new stream would be admitted (0: now).
            refusal = self._state.pipeline.refusal()
            status, error = "failed", str(exc)
            retry_s = 0.0 if refusal is None else retry_after_s(refusal)
        except ShareExceeded as exc:
            self._state.refusals.labels("streams").inc()
            status, error, retry_s = "failed", str(exc), exc.retry_after_s
        except OmnitrioError as exc:
            status, error = "failed", str(exc)
        except trio.Cancelled:
            log.done("disconnected")  # the connection went away mid-response
            raise
        finally:
            del self._responses[rid]
            self._stir()  # (nothing is queued yet: response.done comes below)
        if waiting.cancelled_caught and self._ending:  # the server drains (end_when_quiet)
            refused = self._state.refuse("draining")
            status, error, retry_s = "failed", str(refused), retry_after_s(refused)
        elif reading.cancelled_caught or waiting.cancelled_caught:
            status = "cancelled"
        log.done(status)
        item_id = self._session.active_item_id
        if self._media is not None and item_id in self._playing:
            nursery.start_soon(self._played_out, item_id, self._media)
        finished = self._session.finish(rid, status, error, retry_after_s=retry_s)  # type: ignore[arg-type]
        await self._dispatch(nursery, finished)

    async def _forward(
        self, rid: str, stream: AsyncIterable[VisibleItem], log: ResponseLog
    ) -> None:
        rate_hz = self._state.settings.output_sample_rate_hz
        first_audio = True
        async for item in stream:
            if isinstance(item, AudioChunk):
                if first_audio:
                    mark("answer_audio", rid)  # both transports: the latency benchmark
                    first_audio = False
                log.audio()
                item = AudioChunk(resample_pcm16(item.pcm16, item.sample_rate_hz, rate_hz), rate_hz)
            events = self._session.output(rid, item)
            if self._media is not None and isinstance(item, AudioChunk) and events:
                events = await self._play(rid, item, events, self._media)
            for event in events:
                await self._queue(event)

    async def _play(
        self, rid: str, chunk: AudioChunk, events: list[ServerEvent], media: Media
    ) -> list[ServerEvent]:
        """A WebRTC call: the chunk goes to the track (waiting while the playout is
        full); its events go out without the audio."""
        item_id = self._session.active_item_id
        if item_id is None:
            return events
        if item_id not in self._playing:
            self._playing[item_id] = rid
            await self._queue(ServerEvent("output_audio_buffer.started", {"response_id": rid}))
        await media.play(item_id, chunk.pcm16, chunk.sample_rate_hz)
        return [event for event in events if event.type not in AUDIO_DELTAS]

    async def _played_out(self, item_id: str, media: Media) -> None:
        """output_audio_buffer.stopped once a finished answer's audio has all gone out
        (not after a barge-in cut it: output_audio_buffer.cleared said so)."""
        await media.end_item(item_id)
        await media.wait_played_out()
        response_id = self._playing.pop(item_id, None)
        if response_id is not None:
            await self._queue(
                ServerEvent("output_audio_buffer.stopped", {"response_id": response_id})
            )
        self._stir()

    async def _refuse_session(self, refused: SessionRefused) -> None:
        """A session past a per-client total: an ``error`` event saying which, then 1013."""
        error = {
            "type": "rate_limit_error",
            "code": "too_many_sessions",
            "message": str(refused),
            "param": None,
            "event_id": None,
            "retry_after_s": refused.retry_after_s,
        }
        with trio.move_on_after(self._state.settings.send_timeout_s):
            await self._ws.send(self._session.encode(ServerEvent("error", {"error": error})))
        await self._close(CLOSE_TRY_AGAIN_LATER, "too many sessions for this API key; retry later")

    async def _close(self, code: int, reason: str) -> None:
        logger.info("closing realtime connection: %s (%d)", reason, code)
        # Shielded (the connection is being torn down) but never longer than 1 s.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
            await self._ws.close(code, reason)


async def refuse_busy(ws: Transport, session: RealtimeSession, refusal: Overloaded) -> None:
    """A new session on a full (or draining) server: an ``error`` event naming the
    refusal with ``retry_after_ms`` (the pipeline's estimate of when a stream frees, else
    1 s), then 1013 with the same hint in its reason, for a client that reads only that
    (1001, going away, where the server is draining)."""
    retry_ms = math.ceil(retry_after_s(refusal) * 1000)
    error = {
        "type": "server_error",
        "code": "server_overloaded",
        "message": str(refusal),
        "param": None,
        "event_id": None,
        "retry_after_ms": retry_ms,
    }
    logger.info("refusing a realtime session: %s", refusal)
    with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
        await ws.send(session.encode(ServerEvent("error", {"error": error})))
        if isinstance(refusal, Draining):  # this server will not have room again
            await ws.close(CLOSE_GOING_AWAY, "server draining; retry on another server")
        else:
            await ws.close(CLOSE_TRY_AGAIN_LATER, f"server busy; retry after {retry_ms} ms")


def session_config(
    state: ServerState, framing: Framing, beta: bool, *, webrtc: bool = False
) -> SessionConfig:
    settings = state.settings
    return SessionConfig(
        session_id=new_id("sess"),
        model=state.model_name,
        framing=framing,
        dialect="beta" if beta else "ga",
        output_sample_rate_hz=settings.output_sample_rate_hz,
        max_input_audio_s=settings.max_input_audio_s,
        max_message_bytes=settings.max_message_bytes,
        max_frame_values=settings.max_frame_values,
        tool_limits=settings.tool_limits,
        max_output_tokens=settings.max_output_tokens,
        server_vad=state.side_stage is not None,
        transcription_model=transcription_model(state.pipeline.config),
        voices=pipeline_voices(state.pipeline.config).names,
        webrtc=webrtc,
    )
