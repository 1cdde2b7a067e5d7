"""Voice chat latency: end of user speech to first answer audio, and each stage's
real-time factor, at several numbers of concurrent conversations.

Usage (from the repository root; needs `scripts/setup dev,voice`)::

    python benchmarks/voice_latency.py [--levels 1,2,4] [--turns 20] [--json out.json]
        [--checkout DIR] [--voice piper|espeak] [--questions latency|paused] [--pause-s 0.4]
        [--config FILE] [--server-log FILE] [--turn-detection server_vad|semantic_vad]
        [--eagerness low|medium|auto|high] [--trace] [--chunk-ms 20] [--listen]
        [--transports websocket,webrtc] [--find-limit CAPS]

``--find-limit 2,3,cpu,3,2`` finds the voice chat's real-time limit instead: each arm on a
server of its own at the last of ``--levels``, a number serving the config with admission
by ``max_streams`` alone at that cap, ``cpu`` (or ``cpu:M``, realtime_margin ``M``) the
config's own admission; it prints each arm's answers, dry answers and refusals, and the
largest cap that kept every answer continuous (benchmarks/voice_limit.py).

``--turn-detection semantic_vad`` makes every conversation ask for semantic_vad
(with ``--eagerness``, default ``auto``) in a session.update before it speaks: the
voice chat's Smart Turn then decides whether a pause ends the turn, at the
eagerness's silence time (high: 250 ms) instead of server_vad's 500 ms.
``--server-log FILE`` keeps the served pipeline's log (its own log is a temporary file).
``--trace`` has the voice stages log when each step of an answer happens
(stages/voice/trace.py), including what the client cannot see while the answer runs
ahead of the turn's end, and prints where the time goes from the end of speech at
one conversation: the VAD's pause (the answer starts), the ASR's start and end, the
LLM's first text, the first phrase complete, its first audio made, speech_stopped,
and the first audio at the client (p50 over the turns, ms after the end of speech).
``--checkout DIR`` serves another checkout of omnitrio (e.g. a ``git worktree`` of
an older commit) with this client, for before/after figures from one session.

What runs
---------
``omnitrio run`` (the default pipeline, configs/voice-chat.yaml) in a subprocess;
this process is the client. Each conversation is one Realtime WebSocket with
server_vad turn detection (or ``--turn-detection``), fed like a microphone: 20 ms
(``--chunk-ms``) PCM16 chunks, each sent when its last sample would have been recorded (real time),
silence between questions. A turn is a question (rotating through a few; ``--questions latency``:
half of them have a mid-sentence pause; ``paused``: eight questions, each with one)
then silence until the answer's response.done; the next turn follows at once (with
``--listen``: once the answer would have played to its end, as a person listening
to it before asking again). The
questions are said by ``--voice``: the Piper voice without its sampled noise (the
default) or espeak-ng; a pause is ``--pause-s`` of silence inserted into the whole
sentence's reading (its prosody runs on through the pause, as a person's does;
tests/voice_support.py ``paused_speech``).

Turn splits and false barge-ins: a ``speech_stopped`` that arrives before the
question's speech has ended is a split (the server took the pause for the end of
the turn); a response cancelled while the question is still being spoken is a
false barge-in. A late end is a turn whose speech_stopped came more than
``LATE_END_S`` after the end of its speech (the detector waited on past the
500 ms silence, e.g. when Smart Turn heard the sentence as unfinished). The turn's
answer is the response created after the last ``speech_stopped``; its first audio
is what the latency measures.

At each level, ``--turns`` turns in all are spread over the conversations (at
least one each), all conversations running at once.

Measured per turn (client clock): end of speech (the question's last non-silent
sample) to the first ``response.output_audio.delta``; it includes the VAD's
silence_duration_ms (500 ms) that has to pass before a turn is over (the server
starts the answer at the first pause, ``pause_ms``, and shows it once the turn
ends). Also speech_stopped arrival to first audio (the pipeline's own part), and
the server's count of speculative answers taken and dropped (/metrics).

End of speech to first *sound*: to the first sample over ``SOUND_LEVEL``, for a
client that plays each delta as it comes; over WebRTC the first audio is counted so
already (the first frame with sound decoded off the remote track), so this column
compares the two transports like for like. ``--transports websocket,webrtc`` runs each
level on each (the WebRTC caller is tests/webrtc_support.py's aiortc peer); ``--trace``
then also shows when the first audio reached its transport and when a call's track
sent it (omnitrio/_trace.py).

Answers run dry: turns whose answer audio, played from its first delta on, would
have run out before the next delta arrived (a client with no buffer of its own),
and for how long in all. Over WebRTC: the remote track's frames lost, and the
receive buffer a client would have needed to play every frame on time (the latest
any frame came after the clock set by the frames before it).

The server's CPU time per turn (``/proc``: the server process and the espeak-ng runs
it waited for; the VAD on the silence between turns and the speculations dropped
included): what one answer costs the cores, for the bound at several conversations
(turns x CPU s / cores). Beside it the CPU other processes on the machine took over
the level, in cores on average (``/proc/stat``'s busy time less the server's and the
benchmark's own): a level measured beside other work ran on fewer cores (at four
conversations on two cores, the TTS fell behind for seconds while one took ~1).

Stage real-time factors per level, from the server's /metrics busy seconds
(time each stage's thread spent in stage calls) over the audio each stage
handled: vad over all audio sent, asr over committed input audio (the
transcription event's usage), tts over answer audio received; llm over answer
audio too (seconds of LLM compute per second of speech it fed), with ms per
text delta.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio
import trio_websocket

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import voice_late_parts as late_parts  # noqa: E402
from benchmarks import voice_limit  # noqa: E402
from tests.voice_support import INPUT_RATE_HZ, paused_speech  # noqa: E402
from tests.webrtc_support import SOUND_LEVEL, Caller, run_caller, track_gaps  # noqa: E402

CHUNK_S = 0.02
QUESTION_SETS = {
    "latency": (
        "What do cats like to eat?",
        "Why is the sky blue, | and why are sunsets red?",
        "Tell me a story about a dragon.",
        "What is a good name | for a small dog?",
    ),
    "paused": (
        "Why is the sky blue, | and why are sunsets red?",
        "What is a good name | for a small dog?",
        "Can you tell me | how far away the moon is?",
        "What is the capital of | France?",
        "How do I make | a cup of tea?",
        "Tell me a story | about a dragon.",
        "What do cats | like to eat?",
        "Which animals live | in the ocean?",
    ),
}
SILENCE_LEVEL = 0.01
LATE_END_S = 1.0
TRACE_ENV = "OMNITRIO_VOICE_TRACE"  # stages/voice/trace.py
SERVING = re.compile(r"omnitrio serving .* at (http://[^\s,]+)")
CLIENT_BUFFER_S = 0.2  # the client: it buffers 200 ms before it plays
TURN_TIMEOUT_S = 300.0  # a loaded machine answers slowly at four conversations


@dataclass
class Turn:
    conversation: int
    question: str
    end_of_speech_to_first_audio_s: float | None = None
    # The first sample with sound (over SOUND_LEVEL) played, for a client that plays
    # each delta as it comes: over WebRTC the first audio is counted so already
    end_of_speech_to_first_sound_s: float | None = None
    speech_stopped_to_first_audio_s: float | None = None
    end_of_speech_to_stopped_s: float | None = None  # the detector's wait
    speech_stopped_to_transcript_s: float | None = None  # ASR (and the commit)
    transcript_to_first_text_s: float | None = None  # LLM prefill and first token
    first_text_to_first_audio_s: float | None = None  # first phrase written and spoken
    input_audio_s: float = 0.0
    answer_audio_s: float = 0.0
    num_text_deltas: int = 0
    heard: str = ""  # the turn's transcript (the ASR's), and the answer's text (--json)
    answer_text: str = ""
    # How long a client playing the answer from its first audio on would have run dry
    # (an audio delta arriving after the audio before it had all played), in all
    underrun_s: float = 0.0
    # ... and for a client that starts it CLIENT_BUFFER_S after its first audio
    underrun_buffered_s: float = 0.0
    played_until: float = 0.0  # (trio clock) when that client would have played it all
    num_splits: int = 0  # speech_stopped before the question's speech ended
    num_false_barge_ins: int = 0  # responses cancelled while the question went on
    status: str = ""
    error: str = ""  # why the response failed (its status details)
    retry_after_ms: int | None = None  # ... and when it said to retry, if it did
    # On the system's monotonic clock (as the server's trace): turn start, end of
    # speech, speech_stopped and first audio at the client
    clock_s: dict[str, float] = field(default_factory=dict)
    trace_ms: dict[str, float] = field(default_factory=dict)  # --trace: ms after end of speech


@dataclass
class Level:
    conversations: int
    transport: str = "websocket"
    turns: list[Turn] = field(default_factory=list)
    audio_sent_s: float = 0.0
    busy_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute, at the start and the end
    server_cpu_s: float = math.nan  # the server's CPU time over the level (its children too)
    others_cpu_s: float = math.nan  # the machine's, less the server's and this process's
    track_frames_lost: int = 0  # WebRTC: answer frames that never came, in all calls
    track_late_s: float = 0.0  # ... and the receive buffer that would have played all
    clock_span_s: tuple[float, float] = (0.0, 0.0)  # start and end, as Turn.clock_s


def speech(question: str, folder: Path, voice: str, pause_s: float) -> tuple[bytes, float]:
    """PCM16 of the question (``|`` marks a pause of ``pause_s``) and where its speech
    ends (seconds)."""
    pcm16 = paused_speech(question, folder, pause_s=pause_s, voice=voice)
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768
    loud = np.nonzero(np.abs(samples) > SILENCE_LEVEL)[0]
    return pcm16, (int(loud[-1]) + 1) / INPUT_RATE_HZ


@dataclass(frozen=True)
class Detection:
    """The turn detection the conversations ask for."""

    kind: str = "server_vad"
    eagerness: str = "auto"  # semantic_vad's

    def session(self) -> dict[str, object] | None:
        """The session object that asks for it (None: the server's default)."""
        if self.kind == "server_vad":
            return None
        asked = {"type": self.kind, "eagerness": self.eagerness}
        return {"type": "realtime", "audio": {"input": {"turn_detection": asked}}}

    def update(self) -> str | None:
        """The session.update that asks for it (None: the server's default, server_vad)."""
        if self.kind == "server_vad":
            return None
        asked = {"type": self.kind, "eagerness": self.eagerness}
        session = {"type": "realtime", "audio": {"input": {"turn_detection": asked}}}
        return json.dumps({"type": "session.update", "session": session})


async def converse(
    url: str,
    index: int,
    num_turns: int,
    voices: dict[str, tuple[bytes, float]],
    level: Level,
    detection: Detection,
    chunk_s: float = CHUNK_S,
    listen_to_answers: bool = False,
) -> None:
    chunk_bytes = int(chunk_s * INPUT_RATE_HZ) * 2
    silence = bytes(chunk_bytes)
    async with trio_websocket.open_websocket_url(url, max_message_size=16 << 20) as ws:
        created = json.loads(await ws.get_message())
        assert created["type"] == "session.created", created
        update = detection.update()
        if update is not None:
            await ws.send_message(update)
            while (reply := json.loads(await ws.get_message()))["type"] != "session.updated":
                if reply["type"] == "error":
                    raise RuntimeError(f"session.update refused: {reply['error']}")

        async def send(pcm16: bytes) -> None:
            await ws.send_message(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()}
                )
            )
            level.audio_sent_s += len(pcm16) / 2 / INPUT_RATE_HZ

        questions = list(voices)
        for number in range(num_turns):
            question = questions[(index + number) % len(questions)]
            pcm16, speech_end_s = voices[question]
            turn = Turn(index, question)
            level.turns.append(turn)

            async def microphone(pcm16: bytes = pcm16) -> None:
                start = trio.current_time()
                chunks = [pcm16[i : i + chunk_bytes] for i in range(0, len(pcm16), chunk_bytes)]
                for n in range(1_000_000):  # then silence, until the answer is done
                    await trio.sleep_until(start + (n + 1) * chunk_s)
                    await send(chunks[n] if n < len(chunks) else silence)

            with trio.fail_after(TURN_TIMEOUT_S):
                async with trio.open_nursery() as nursery:
                    started = trio.current_time()
                    turn.clock_s["start"] = time.monotonic()
                    turn.clock_s["speech_end"] = time.monotonic() + speech_end_s
                    nursery.start_soon(microphone)
                    await listen(ws, turn, started + speech_end_s)
                    if listen_to_answers:  # silence goes on while the answer plays
                        await trio.sleep_until(turn.played_until)
                    nursery.cancel_scope.cancel()


ANSWER_EVENTS = (
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.done",
)


def run_dry(played_from: float, audio_s: float, now: float) -> tuple[float, float]:
    """A delta arrives at ``now`` after ``audio_s`` of the answer, whose playing began at
    ``played_from``: when playing (re)began, and how long it had run dry (0: not)."""
    dry_s = max(0.0, now - (played_from + audio_s))
    return played_from + dry_s, dry_s  # playing resumes with this delta


def response_id(event: dict[str, object]) -> object:
    response = event.get("response")
    return response.get("id") if isinstance(response, dict) else event.get("response_id")


@dataclass
class TurnEvents:
    """Where a turn stands as its events come (both transports): when speech_stopped,
    the transcript and the answer's first text came, and which response answers it."""

    stopped: float | None = None
    transcript: float | None = None
    first_text: float | None = None
    answer: str | None = None

    def take(
        self, turn: Turn, event: dict[str, Any], now: float, speech_end: float, clock: float
    ) -> bool:
        """Note ``event`` (at ``now``; ``clock``: time.monotonic()); True when it is of
        a response to part of the question, which the caller skips."""
        kind = event["type"]
        if kind == "error":
            raise RuntimeError(f"error event: {event['error']}")
        if kind == "input_audio_buffer.speech_started":
            self.answer = None  # a response under way now is to part of the question
        elif kind == "input_audio_buffer.speech_stopped":
            if now < speech_end:
                turn.num_splits += 1
            else:
                turn.end_of_speech_to_stopped_s = now - speech_end
            turn.clock_s["stopped"] = clock
            self.stopped, self.transcript, self.first_text, self.answer = now, None, None, None
        elif kind == "response.created" and self.stopped is not None:
            self.answer = event["response"]["id"]
        elif kind == "conversation.item.input_audio_transcription.completed":
            turn.input_audio_s = float(event.get("usage", {}).get("seconds", 0.0))
            turn.heard = str(event.get("transcript", ""))
            self.transcript = now
            if self.stopped is not None:
                turn.speech_stopped_to_transcript_s = now - self.stopped
        elif kind in ANSWER_EVENTS and (self.answer is None or response_id(event) != self.answer):
            if kind == "response.done" and event["response"]["status"] == "cancelled":
                turn.num_false_barge_ins += 1
            return True
        elif kind == "response.output_audio_transcript.delta":
            turn.num_text_deltas += 1
            turn.answer_text += str(event.get("delta", ""))
            if self.first_text is None:
                self.first_text = now
                if self.transcript is not None:
                    turn.transcript_to_first_text_s = now - self.transcript
        return False

    def first_audio(self, turn: Turn, now: float, speech_end: float, clock: float) -> None:
        turn.clock_s["first_audio"] = clock
        turn.end_of_speech_to_first_audio_s = now - speech_end
        if self.stopped is not None:
            turn.speech_stopped_to_first_audio_s = now - self.stopped
        if self.first_text is not None:
            turn.first_text_to_first_audio_s = now - self.first_text

    def done(self, turn: Turn, event: dict[str, Any]) -> None:
        turn.status = event["response"]["status"]
        details = event["response"].get("status_details") or {}
        if turn.status != "completed":
            turn.error = str(details.get("error") or details)[:200]
            error = details.get("error")
            hint = error.get("retry_after_ms") if isinstance(error, dict) else None
            turn.retry_after_ms = hint if isinstance(hint, int) else None


async def listen(ws: trio_websocket.WebSocketConnection, turn: Turn, speech_end: float) -> None:
    seen = TurnEvents()
    played_from = 0.0  # when a client playing the answer would have started it
    buffered_from = 0.0  # ... and a client that buffers CLIENT_BUFFER_S first
    while True:
        event = json.loads(await ws.get_message())
        kind = event["type"]
        now = trio.current_time()
        if seen.take(turn, event, now, speech_end, time.monotonic()):
            continue
        if kind == "response.output_audio.delta":
            if turn.end_of_speech_to_first_audio_s is None:
                played_from, buffered_from = now, now + CLIENT_BUFFER_S
                seen.first_audio(turn, now, speech_end, time.monotonic())
            played_from, dry_s = run_dry(played_from, turn.answer_audio_s, now)
            turn.underrun_s += dry_s
            buffered_from, dry_s = run_dry(buffered_from, turn.answer_audio_s, now)
            turn.underrun_buffered_s += dry_s
            pcm = np.frombuffer(base64.b64decode(event["delta"]), "<i2")
            loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > SOUND_LEVEL)
            if turn.end_of_speech_to_first_sound_s is None and loud.size:
                sound_at = played_from + turn.answer_audio_s + loud[0] / INPUT_RATE_HZ
                turn.end_of_speech_to_first_sound_s = sound_at - speech_end
            turn.answer_audio_s += pcm.size / INPUT_RATE_HZ
        elif kind == "response.done":
            turn.played_until = played_from + turn.answer_audio_s
            turn.clock_s["done"] = time.monotonic()
            seen.done(turn, event)
            return


async def converse_webrtc(
    base_url: str,
    index: int,
    num_turns: int,
    voices: dict[str, tuple[bytes, float]],
    level: Level,
    detection: Detection,
    listen_to_answers: bool = False,
) -> None:
    """One conversation as a WebRTC call (asyncio; tests/webrtc_support.py's caller): the
    questions go out on the microphone track at real time, with silence between them."""
    caller = Caller(base_url)
    try:
        await caller.connect(detection.session())
        await caller.wait_type("session.created", TURN_TIMEOUT_S)
        questions = list(voices)
        for number in range(num_turns):
            question = questions[(index + number) % len(questions)]
            pcm16, speech_end_s = voices[question]
            turn = Turn(index, question)
            level.turns.append(turn)
            seen = len(caller.events)
            start = caller.mic.say(pcm16)
            turn.clock_s["start"], turn.clock_s["speech_end"] = start, start + speech_end_s
            await listen_webrtc(caller, turn, start + speech_end_s, seen, listen_to_answers)
        lost, late_s = track_gaps(caller.frames)
        level.track_frames_lost += lost
        level.track_late_s = max(level.track_late_s, late_s)
    finally:
        await caller.close()


async def listen_webrtc(
    caller: Caller, turn: Turn, speech_end: float, seen_events: int, listen_to_answers: bool
) -> None:
    """As ``listen``, on the call's data channel; the first answer audio is the first
    frame with sound on the remote track after speech_stopped (heard, not announced)."""
    seen = TurnEvents()
    index = seen_events
    while True:
        event, now = await caller.next_event(index, TURN_TIMEOUT_S)
        index += 1
        if not seen.take(turn, event, now, speech_end, now) and event["type"] == "response.done":
            seen.done(turn, event)
            if turn.status != "completed":
                return
            break
    stopped = seen.stopped
    assert stopped is not None
    async with asyncio.timeout(TURN_TIMEOUT_S):
        # The frames come on aiortc's reader task, which sets no event: look every 5 ms.
        while not (heard := [t for t in caller.audio_times if t > stopped]):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    seen.first_audio(turn, heard[0], speech_end, heard[0])
    turn.end_of_speech_to_first_sound_s = turn.end_of_speech_to_first_audio_s
    if listen_to_answers:
        await caller.wait_for(
            lambda e: (
                e["type"] in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
                and e.get("response_id") == seen.answer
            ),
            TURN_TIMEOUT_S,
        )


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used, with its children waited for (espeak-ng's runs):
    utime, stime, cutime and cstime of /proc/<pid>/stat (nan where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """CPU time all the machine's cores have spent busy (user, nice, system, irq and
    softirq of /proc/stat's first line; not idle, iowait or steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def others_cpu_seconds(server_pid: int) -> float:
    """The machine's busy CPU time less the server's and this process's (with their
    children waited for): what other processes took from the cores. A level beside
    such work runs on fewer cores than it was measured for; the table shows it."""
    return machine_cpu_seconds() - cpu_seconds(server_pid) - cpu_seconds(os.getpid())


def busy_seconds(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    busy = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^omnitrio_stage_busy_seconds_total\{stage="(\w+)"\} (\S+)$', text, re.M
        )
    }
    vad = re.search(r"^omnitrio_side_stage_busy_seconds_total (\S+)$", text, re.M)
    busy["vad"] = float(vad.group(1)) if vad else math.nan
    for outcome in ("taken", "dropped"):  # counts, not seconds; absent on older servers
        found = re.search(
            rf'^omnitrio_speculative_answers_total\{{outcome="{outcome}"\}} (\S+)$', text, re.M
        )
        busy[f"speculations {outcome}"] = float(found.group(1)) if found else math.nan
    busy.update(admission_waits(text))
    return busy


# Admission waits (i41's block; pipeline.admission_wait_s): requests that waited to be
# admitted, by how the wait ended, and the seconds waited; nan on servers without them.
WAIT_OUTCOMES = ("admitted", "refused", "left")


def admission_waits(metrics: str) -> dict[str, float]:
    found = {
        outcome: re.search(
            rf'^omnitrio_admission_waits_total\{{outcome="{outcome}"\}} (\S+)$', metrics, re.M
        )
        for outcome in WAIT_OUTCOMES
    }
    waits = {f"waited {k}": float(m.group(1)) if m else math.nan for k, m in found.items()}
    seconds = re.search(r"^omnitrio_admission_wait_seconds_total (\S+)$", metrics, re.M)
    waits["waited s"] = float(seconds.group(1)) if seconds else math.nan
    return waits


def waits_report(levels: list[Level]) -> str:
    """One line a level: the turns that waited to be admitted (and how long in all), and
    how their waits ended."""
    lines = []
    for level in levels:
        values = {k: level.busy_s.get(f"waited {k}", math.nan) for k in WAIT_OUTCOMES}
        if any(math.isnan(value) for value in values.values()):
            lines.append(f"{level.transport}, {level.conversations}: no admission waits reported")
            continue
        counts = {k: round(value) for k, value in values.items()}
        waited = sum(counts.values())
        seconds = level.busy_s["waited s"]
        lines.append(
            f"{level.transport}, {level.conversations} conversations: {waited} requests waited "
            f"to be admitted ({seconds:.2f} s in all, {seconds / max(waited, 1):.2f} s each), "
            f"{counts['admitted']} then admitted, {counts['refused']} refused, "
            f"{counts['left']} left while waiting"
        )
    return "\n".join(lines)


async def run_level(
    base_url: str,
    conversations: int,
    turns: int,
    voices: dict[str, tuple[bytes, float]],
    detection: Detection,
    chunk_s: float = CHUNK_S,
    server_pid: int = 0,
    listen_to_answers: bool = False,
    transport: str = "websocket",
) -> Level:
    level = Level(conversations, transport)
    load_before = os.getloadavg()[0]
    cpu_before = cpu_seconds(server_pid)
    others_before = others_cpu_seconds(server_pid)
    before = await trio.to_thread.run_sync(busy_seconds, base_url)
    per = [turns // conversations + (i < turns % conversations) for i in range(conversations)]
    url = base_url.replace("http://", "ws://") + "/v1/realtime"
    started = time.perf_counter()
    clock_started = time.monotonic()
    if transport == "webrtc":

        async def calls() -> None:
            await asyncio.gather(
                *(
                    converse_webrtc(
                        base_url, i, max(1, n), voices, level, detection, listen_to_answers
                    )
                    for i, n in enumerate(per)
                )
            )

        await trio.to_thread.run_sync(run_caller, calls)
        level.audio_sent_s = conversations * (
            time.perf_counter() - started
        )  # the track never stops
    async with trio.open_nursery() as nursery:
        for index, num_turns in enumerate(per) if transport == "websocket" else ():
            nursery.start_soon(
                converse,
                url,
                index,
                max(1, num_turns),
                voices,
                level,
                detection,
                chunk_s,
                listen_to_answers,
            )
    level.wall_s = time.perf_counter() - started
    level.clock_span_s = (clock_started, time.monotonic())
    after = await trio.to_thread.run_sync(busy_seconds, base_url)
    level.busy_s = {name: after[name] - before.get(name, 0.0) for name in after}
    level.load_average = (load_before, os.getloadavg()[0])
    level.server_cpu_s = cpu_seconds(server_pid) - cpu_before
    level.others_cpu_s = others_cpu_seconds(server_pid) - others_before
    return level


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(part: float, whole: float) -> float:
    """``part / whole``, nan where ``whole`` is 0 (over WebRTC the answer's audio is
    heard, not counted: its real-time factors are not shown)."""
    return part / whole if whole else math.nan


def p50(turns: list[Turn], name: str) -> str:
    values = [getattr(t, name) * 1000 for t in turns if getattr(t, name) is not None]
    return f"{percentile(values, 50):.0f}" if values else "-"


def breakdown(levels: list[Level]) -> str:
    lines = [
        "| transport | conversations | speech_stopped -> transcript | transcript -> first text "
        "| first text -> first audio | server CPU s per turn | answers run dry (s in all) "
        "| ... with a 200 ms buffer | refused (with a retry hint) "
        "| track frames lost, receive buffer for no gap (ms) | load average (start, end) "
        "| other processes' CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        load = "{:.1f}, {:.1f}".format(*level.load_average)
        others = level.others_cpu_s / level.wall_s if level.wall_s else math.nan
        track = (
            f"{level.track_frames_lost}, {level.track_late_s * 1000:.0f}"
            if level.transport == "webrtc"
            else "-"
        )
        lines.append(
            f"| {level.transport} | {level.conversations} "
            f"| {p50(level.turns, 'speech_stopped_to_transcript_s')} "
            f"| {p50(level.turns, 'transcript_to_first_text_s')} "
            f"| {p50(level.turns, 'first_text_to_first_audio_s')} "
            f"| {level.server_cpu_s / max(1, len(level.turns)):.2f} "
            f"| {sum(t.underrun_s > 0 for t in level.turns)} "
            f"({sum(t.underrun_s for t in level.turns):.2f}) "
            f"| {sum(t.underrun_buffered_s > 0 for t in level.turns)} "
            f"({sum(t.underrun_buffered_s for t in level.turns):.2f}) "
            f"| {sum(t.status == 'failed' for t in level.turns)} "
            f"({sum(t.retry_after_ms is not None for t in level.turns)}) | {track} | {load} "
            f"| {others:.2f} |"
        )
    return "\n".join(lines)


def report(levels: list[Level]) -> str:
    lines = [
        "| transport | conversations | turns | end of speech -> first audio p50 / p90 (ms) "
        "| end of speech -> first sound p50 / p90 (ms) "
        "| speech_stopped -> first audio p50 / p90 (ms) | RTF vad | RTF asr | RTF llm "
        "| llm ms/delta | RTF tts | turn splits | late ends | end of speech -> speech_stopped "
        "p50 / p90 (ms) | false barge-ins | speculative answers taken / dropped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        done = [t for t in level.turns if t.end_of_speech_to_first_audio_s is not None]
        eos = [t.end_of_speech_to_first_audio_s * 1000 for t in done]  # type: ignore[operator]
        sound = [
            t.end_of_speech_to_first_sound_s * 1000
            for t in done
            if t.end_of_speech_to_first_sound_s is not None
        ]
        ss = [
            t.speech_stopped_to_first_audio_s * 1000
            for t in done
            if t.speech_stopped_to_first_audio_s
        ]
        answer_s = sum(t.answer_audio_s for t in level.turns)
        input_s = sum(t.input_audio_s for t in level.turns)
        deltas = sum(t.num_text_deltas for t in level.turns)
        waits = [
            t.end_of_speech_to_stopped_s * 1000
            for t in level.turns
            if t.end_of_speech_to_stopped_s is not None
        ]
        late = sum(w > LATE_END_S * 1000 for w in waits)
        busy = level.busy_s
        lines.append(
            f"| {level.transport} | {level.conversations} | {len(done)} "
            f"| {percentile(eos, 50):.0f} / {percentile(eos, 90):.0f} "
            f"| {percentile(sound, 50):.0f} / {percentile(sound, 90):.0f} "
            f"| {percentile(ss, 50):.0f} / {percentile(ss, 90):.0f} "
            f"| {ratio(busy['vad'], level.audio_sent_s):.3f} "
            f"| {ratio(busy.get('asr', math.nan), input_s):.3f} "
            f"| {ratio(busy.get('llm', math.nan), answer_s):.3f} "
            f"| {ratio(busy.get('llm', math.nan), deltas) * 1000:.1f} "
            f"| {ratio(busy.get('tts', math.nan), answer_s):.3f} "
            f"| {sum(t.num_splits for t in level.turns)} | {late} "
            f"| {percentile(waits, 50):.0f} / {percentile(waits, 90):.0f} "
            f"| {sum(t.num_false_barge_ins for t in level.turns)} "
            f"| {busy['speculations taken']:.0f} / {busy['speculations dropped']:.0f} |"
        )
    return "\n".join(lines)


TRACE = re.compile(r"voice-trace (\S+) (\S+) ([\d.]+)")
TRACE_STEPS = (
    ("speech_paused", "VAD pause (answer starts)"),
    ("asr_start", "ASR starts"),
    ("asr_end", "ASR ends"),
    ("llm_start", "LLM starts"),
    ("llm_first_text", "LLM first text"),
    ("tts_first_phrase", "first phrase complete"),
    ("tts_part_phonemes", "its first words' phonemes"),
    ("tts_part_front", "their front pass"),
    ("tts_first_audio", "its first audio made"),
    ("speech_stopped", "VAD speech_stopped"),
    ("answer_audio", "its first audio to the transport"),
    ("track_first_frame", "a call's track sends it"),
    ("client_first_audio", "first audio at the client"),
)


def attach_trace(level: Level, log_text: str) -> None:
    """Each turn's trace (``--trace``, one conversation): the answer it heard is the
    last stream whose ASR started between the turn's start and its first audio (an
    earlier one was a speculation dropped at a mid-sentence pause)."""
    marks = [(m.group(1), m.group(2), float(m.group(3))) for m in TRACE.finditer(log_text)]
    for turn in level.turns:
        clock = turn.clock_s
        if "first_audio" not in clock:
            continue
        start, end, heard = clock["start"], clock["speech_end"], clock["first_audio"]
        asr = [(t, sid) for what, sid, t in marks if what == "asr_start" and start <= t <= heard]
        if not asr:
            continue
        answer = max(asr)[1]
        steps = {what: t for what, sid, t in marks if sid == answer}
        pauses = [t for what, _, t in marks if what == "speech_paused" and start <= t]
        pauses = [t for t in pauses if t <= steps["asr_start"]]
        stops = [t for what, _, t in marks if what == "speech_stopped" and t >= end]
        if pauses:
            steps["speech_paused"] = max(pauses)
        if stops:
            steps["speech_stopped"] = min(stops)
        for what in ("answer_audio", "track_first_frame"):  # omnitrio/_trace.py
            after = [t for w, _, t in marks if w == what and end <= t <= heard]
            if after:
                steps[what] = min(after)
        steps["client_first_audio"] = heard
        turn.trace_ms = {what: (t - end) * 1000 for what, t in steps.items()}


def trace_report(level: Level) -> str:
    lines = [
        f"| step ({level.conversations} conversation, {len(level.turns)} turns) "
        "| ms after the end of speech, p50 | p90 | turns |",
        "|---|---|---|---|",
    ]
    for what, words in TRACE_STEPS:
        values = [t.trace_ms[what] for t in level.turns if what in t.trace_ms]
        if values:
            lines.append(
                f"| {words} | {percentile(values, 50):.0f} | {percentile(values, 90):.0f} "
                f"| {len(values)} |"
            )
    return "\n".join(lines)


def late_parts_report(levels: list[Level], log_text: str) -> str:
    """The TTS's later parts at each level (``--trace``), those made too late for a
    client that buffers CLIENT_BUFFER_S blamed on what held them (voice_late_parts.py)."""
    found = late_parts.parts(log_text)
    lines = [
        "| transport | conversations | later parts | late for a 200 ms buffer, waiting on: "
        + " | ".join(f"{cause} (s late in all)" for cause in late_parts.CAUSES)
        + " |",
        "|---|---|---|" + "---|" * len(late_parts.CAUSES),
    ]
    for level in levels:
        seen = late_parts.lateness(found, *level.clock_span_s, CLIENT_BUFFER_S)
        causes = " | ".join(f"{n} ({s:.2f})" for n, s in seen.late.values())
        lines.append(f"| {level.transport} | {level.conversations} | {seen.num_parts} | {causes} |")
    for level in levels:
        late = late_parts.late_list(log_text, *level.clock_span_s, CLIENT_BUFFER_S)
        if late:
            lines.append(f"\nLate at {level.conversations} ({level.transport}), one by one:")
            lines.extend(f"- {line}" for line in late)
    return "\n".join(lines)


def start_server(
    log_path: Path, checkout: Path, extra: list[str], *, trace: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "omnitrio._cli", "--log-level", "WARNING", "run", *extra]
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [*command, "--port", "0"],
            cwd=checkout,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **({TRACE_ENV: "1"} if trace else {})},
        )
    deadline = time.monotonic() + 300
    while not (found := SERVING.search(log_path.read_text(errors="replace"))):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"omnitrio run did not start:\n{log_path.read_text()}")
        time.sleep(0.2)  # a subprocess's log file has nothing to wait on
    return server, found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,2,4", help="concurrent conversations")
    parser.add_argument("--turns", type=int, default=20, help="turns per level, in all")
    parser.add_argument("--json", type=Path, help="write the raw turns here")
    parser.add_argument(
        "--checkout", type=Path, default=REPO, help="the omnitrio checkout to serve"
    )
    parser.add_argument("--voice", choices=("piper", "espeak"), default="piper")
    parser.add_argument("--questions", choices=tuple(QUESTION_SETS), default="latency")
    parser.add_argument("--pause-s", type=float, default=0.4, help="a mid-sentence pause")
    parser.add_argument("--config", type=Path, help="serve this config, not the default")
    parser.add_argument("--server-log", type=Path, help="keep the server's log here")
    parser.add_argument(
        "--turn-detection", choices=("server_vad", "semantic_vad"), default="server_vad"
    )
    parser.add_argument("--eagerness", choices=("low", "medium", "auto", "high"), default="auto")
    parser.add_argument(
        "--chunk-ms", type=int, default=20, help="audio per input_audio_buffer.append"
    )
    parser.add_argument(
        "--trace", action="store_true", help="the stages' step times, at one conversation"
    )
    parser.add_argument(
        "--transports",
        default="websocket",
        help="websocket, webrtc, or both (websocket,webrtc): each level on each, in turn",
    )
    parser.add_argument(
        "--listen",
        action="store_true",
        help="ask the next question once the answer would have played, not at response.done",
    )
    parser.add_argument(
        "--find-limit",
        metavar="CAPS",
        help="the voice chat's limit: serve each cap (e.g. 2,3,cpu,3,2; cpu: the config's own "
        "admission, cpu:M with realtime_margin M) at the last of --levels, one server each "
        "(benchmarks/voice_limit.py)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        voices = {
            q: speech(q, Path(scratch), args.voice, args.pause_s)
            for q in QUESTION_SETS[args.questions]
        }
        if args.find_limit:
            find_limit(args, voices, Path(scratch))
            return
        extra = ["--config", str(args.config.resolve())] if args.config else []
        log = Path(scratch) / "server.log"
        levels = serve(args, voices, extra, log, args.levels.split(","))
        log_text = log.read_text(errors="replace")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(level) for level in levels], indent=1))
    if args.listen:
        print("Pacing: each next question after the answer has played (--listen).\n")
    print(report(levels))
    print("\nWhere the time goes after speech_stopped, p50 (ms):\n")
    print(breakdown(levels))
    print(f"\nAdmission waits (pipeline.admission_wait_s):\n\n{waits_report(levels)}")
    if args.trace:
        print(
            f"\nThe answers' later audio parts (--trace):\n\n{late_parts_report(levels, log_text)}"
        )
    for level in levels:
        if args.trace and level.conversations == 1:
            attach_trace(level, log_text)
            print(f"\nThe answer's steps (--trace):\n\n{trace_report(level)}")
    statuses = {t.status for level in levels for t in level.turns}
    if statuses != {"completed"}:
        errors = {t.error for level in levels for t in level.turns if t.status != "completed"}
        raise SystemExit(f"some turns did not complete: {statuses}; errors: {errors}")


def serve(
    args: argparse.Namespace,
    voices: dict[str, tuple[bytes, float]],
    extra: list[str],
    log: Path,
    conversations: list[str],
) -> list[Level]:
    """One server (``omnitrio run`` with ``extra``, its log in ``log``) through each level
    of ``conversations`` on each of ``--transports``."""
    detection = Detection(args.turn_detection, args.eagerness)
    server, base_url = start_server(log, args.checkout.resolve(), extra, trace=args.trace)
    try:
        return [
            trio.run(
                run_level,
                base_url,
                int(n),
                args.turns,
                voices,
                detection,
                args.chunk_ms / 1000,
                server.pid,
                args.listen,
                transport,
            )
            for n in conversations
            for transport in args.transports.split(",")
        ]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        if args.server_log:
            shutil.copyfile(log, args.server_log)


def find_limit(
    args: argparse.Namespace, voices: dict[str, tuple[bytes, float]], scratch: Path
) -> None:
    """``--find-limit CAPS``: each arm on a server of its own at the last of ``--levels``,
    in the order given; prints each arm's table as it ends, then the limit
    (benchmarks/voice_limit.py)."""
    if args.transports != "websocket":
        raise SystemExit("--find-limit measures over websocket only (--transports websocket)")
    source = (args.config or args.checkout / "configs" / "voice-chat.yaml").resolve()
    conversations = args.levels.split(",")[-1]
    arms: list[voice_limit.Arm] = []
    for i, spec in enumerate(voice_limit.parse_caps(args.find_limit)):
        extra = voice_limit.server_args(source, spec, scratch)
        (level,) = serve(args, voices, extra, scratch / f"server-{i}.log", [conversations])
        arms.append(voice_limit.Arm(spec[0], level, spec[1]))
        print(voice_limit.limit_report(arms).split("\n\n")[0].splitlines()[-1], flush=True)
    print(f"\n{voice_limit.limit_report(arms)}")
    print(
        f"\nAdmission waits (pipeline.admission_wait_s):\n\n{waits_report([a.level for a in arms])}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        runs = [{"cap": a.cap, "margin": a.margin, **asdict(a.level)} for a in arms]
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
