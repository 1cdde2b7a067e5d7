"""The voice frameworks people already use, with their default settings, against
``omnitrio run``'s voice chat (configs/voice-chat.yaml) on /v1/realtime: LiveKit
Agents' ``RealtimeModel.session()`` and Pipecat's ``OpenAIRealtimeLLMService``, each
driven through its own lowest-level Realtime session API (no room, no transport).

Each runs a text turn, an audio turn with server-side turn detection, a barge-in
with truncation, and a tool round trip. The voice models are needed (server VAD,
the ASR stage, the tool-call grammar), so the server is the voice chat, started once
for the module as a process. Needs the ``clients`` extra (pinned in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client_support import TURN_TIMEOUT_S, needs_clients, voice_chat_process
from tests.voice_support import INPUT_RATE_HZ, needs_voice, spoken

pytestmark = [needs_voice, needs_clients, pytest.mark.usefixtures("voice_weights")]

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    yield from voice_chat_process()


# --- LiveKit Agents -------------------------------------------------------------------


class LiveKit:
    """One LiveKit ``RealtimeSession`` with its defaults, and every server event it got."""

    def __init__(self, url: str) -> None:
        import aiohttp
        from livekit.plugins import openai as lk_openai

        self.http = aiohttp.ClientSession()
        model = lk_openai.realtime.RealtimeModel(
            base_url=f"{url}/v1", api_key="unused", http_session=self.http
        )
        self.session = model.session()
        self.events: list[dict[str, Any]] = []
        self.errors: list[object] = []
        self.arrived = asyncio.Event()
        self.session.on("openai_server_event_received", self._event)
        self.session.on("error", self.errors.append)

    def _event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self.arrived.set()

    async def until(self, kind: str, after: int = 0) -> dict[str, Any]:
        """The first server event of type ``kind`` from index ``after`` on."""
        while True:
            for event in self.events[after:]:
                if event["type"] == kind:
                    return event
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), TURN_TIMEOUT_S)

    def server_errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "error"]

    async def close(self) -> None:
        await self.session.aclose()
        await self.http.close()


async def _reply(generation: Any) -> tuple[str, int, list[Any]]:
    """A LiveKit generation's text, audio samples and function calls."""
    text, num_samples = "", 0
    async for message in generation.message_stream:

        async def read_text(message: Any = message) -> str:
            return "".join([t async for t in message.text_stream])

        async def read_audio(message: Any = message) -> int:
            return sum([frame.samples_per_channel async for frame in message.audio_stream])

        got_text, got_samples = await asyncio.gather(read_text(), read_audio())
        text, num_samples = text + got_text, num_samples + got_samples
    calls = [call async for call in generation.function_stream]
    return text, num_samples, calls


def _frames(pcm16: bytes) -> list[Any]:
    from livekit import rtc

    chunk = INPUT_RATE_HZ // 10 * 2  # 100 ms
    return [
        rtc.AudioFrame(pcm16[i : i + chunk], INPUT_RATE_HZ, 1, len(pcm16[i : i + chunk]) // 2)
        for i in range(0, len(pcm16), chunk)
    ]


def test_livekit_text_turn_with_its_default_session(server_url: str) -> None:
    from livekit.agents import llm

    async def run() -> None:
        client = LiveKit(server_url)
        try:
            updated = await client.until("session.updated")
            session = updated["session"]
            # LiveKit's defaults: semantic_vad, gpt-4o-mini-transcribe, voice marin.
            assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            assert session["audio"]["input"]["transcription"]["model"] == "MoonshineAsr"
            assert session["audio"]["output"]["voice"] == "marin"
            context = llm.ChatContext.empty()
            context.add_message(role="user", content="What is the capital of France?")
            await client.session.update_chat_ctx(context)
            generation = await asyncio.wait_for(client.session.generate_reply(), TURN_TIMEOUT_S)
            text, num_samples, calls = await asyncio.wait_for(_reply(generation), TURN_TIMEOUT_S)
            assert "paris" in text.lower()
            assert num_samples > 0
            assert calls == []
            assert client.server_errors() == []
        finally:
            await client.close()

    asyncio.run(run())


def test_livekit_audio_turn_and_barge_in_with_truncation(server_url: str, tmp_path: Path) -> None:
    question = spoken("What do cats like to eat?", tmp_path / "q.wav", silence_after_s=1.5)
    interruption = spoken("Wait, tell me about dogs.", tmp_path / "i.wav", silence_after_s=1.5)

    async def run() -> None:
        client = LiveKit(server_url)
        generations: asyncio.Queue[Any] = asyncio.Queue()
        client.session.on("generation_created", generations.put_nowait)
        try:
            await client.until("session.updated")
            for frame in _frames(question):
                client.session.push_audio(frame)
            first = await asyncio.wait_for(generations.get(), TURN_TIMEOUT_S)
            transcript = await client.until("conversation.item.input_audio_transcription.completed")
            assert "cat" in transcript["transcript"].lower()
            # Barge in as soon as the answer's audio starts: server VAD cancels it.
            message = await asyncio.wait_for(anext(aiter(first.message_stream)), TURN_TIMEOUT_S)
            heard = 0
            async for frame in message.audio_stream:
                heard += frame.samples_per_channel
                if heard == frame.samples_per_channel:
                    mark = len(client.events)
                    for speech in _frames(interruption):
                        client.session.push_audio(speech)
            await client.until("input_audio_buffer.speech_started", mark)
            done = await client.until("response.done", mark)
            assert done["response"]["status"] == "cancelled"
            played_ms = max(1, heard * 1000 // 24000 // 2)
            client.session.truncate(
                message_id=message.message_id, modalities=["audio"], audio_end_ms=played_ms
            )
            truncated = await client.until("conversation.item.truncated", mark)
            assert truncated["audio_end_ms"] == played_ms
            second = await asyncio.wait_for(generations.get(), TURN_TIMEOUT_S)
            text, num_samples, _ = await asyncio.wait_for(_reply(second), TURN_TIMEOUT_S)
            assert text
            assert num_samples > 0
            assert client.server_errors() == []
        finally:
            await client.close()

    asyncio.run(run())


def test_livekit_tool_round_trip(server_url: str) -> None:
    from livekit.agents import llm

    async def get_weather(city: str) -> str:
        return json.dumps({"city": city, "temperature_c": 21, "sky": "sunny"})

    tool = llm.function_tool(
        get_weather,
        raw_schema={
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_SCHEMA,
        },
    )

    async def run() -> None:
        client = LiveKit(server_url)
        try:
            await client.until("session.updated")
            await client.session.update_tools([tool])
            context = llm.ChatContext.empty()
            context.add_message(role="user", content="What is the weather in Paris?")
            await client.session.update_chat_ctx(context)
            generation = await asyncio.wait_for(
                client.session.generate_reply(tool_choice="required"), TURN_TIMEOUT_S
            )
            _, _, calls = await asyncio.wait_for(_reply(generation), TURN_TIMEOUT_S)
            [call] = calls
            assert call.name == "get_weather"
            arguments = json.loads(call.arguments)
            assert set(arguments) == {"city"}
            context = client.session.chat_ctx.copy()
            context.items.append(
                llm.FunctionCallOutput(
                    call_id=call.call_id,
                    name=call.name,
                    output=await get_weather(arguments["city"]),
                    is_error=False,
                )
            )
            await client.session.update_chat_ctx(context)
            generation = await asyncio.wait_for(
                client.session.generate_reply(tool_choice="none"), TURN_TIMEOUT_S
            )
            text, _, calls = await asyncio.wait_for(_reply(generation), TURN_TIMEOUT_S)
            assert calls == []
            assert text
            assert client.server_errors() == []
        finally:
            await client.close()

    asyncio.run(run())


# --- Pipecat --------------------------------------------------------------------------


class Pipecat:
    """Pipecat's ``OpenAIRealtimeLLMService`` with its defaults in a pipeline of its own
    (Pipecat's context aggregators around the service, with a recorder on either side of
    it that notes every frame it sends up or down): no transport. Frames go in with
    ``queue``; ``until`` waits for one out."""

    def __init__(self, url: str, context: Any) -> None:
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineWorker
        from pipecat.processors.aggregators.llm_response_universal import (
            LLMContextAggregatorPair,
        )
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
        from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

        frames: list[Any] = []
        arrived = asyncio.Event()

        class Recorder(FrameProcessor):  # type: ignore[misc]
            """Notes the frames the service sends its way (``facing``)."""

            def __init__(self, facing: FrameDirection) -> None:
                super().__init__()
                self.facing = facing

            async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
                await super().process_frame(frame, direction)
                if direction == self.facing:
                    frames.append(frame)
                    arrived.set()
                await self.push_frame(frame, direction)

        self.frames, self.arrived = frames, arrived
        self.service = OpenAIRealtimeLLMService(
            api_key="unused", base_url=url.replace("http", "ws", 1) + "/v1/realtime"
        )
        self.context = context
        pair = LLMContextAggregatorPair(context)
        self.worker = PipelineWorker(
            Pipeline(
                [
                    pair.user(),
                    Recorder(FrameDirection.UPSTREAM),
                    self.service,
                    Recorder(FrameDirection.DOWNSTREAM),
                    pair.assistant(),
                ]
            ),
            cancel_on_idle_timeout=False,
        )
        self.started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")  # type: ignore[untyped-decorator]
        async def started(worker: Any, frame: Any) -> None:
            self.started.set()

    async def run(self, script: Any) -> None:
        """Run the pipeline while ``script(self)`` drives it; then end it."""
        from pipecat.frames.frames import EndFrame
        from pipecat.workers.runner import WorkerRunner

        runner = WorkerRunner()
        await runner.add_workers(self.worker)

        async def drive() -> None:
            try:
                await asyncio.wait_for(self.started.wait(), TURN_TIMEOUT_S)
                await script(self)
            finally:
                await self.worker.queue_frame(EndFrame())

        await asyncio.gather(runner.run(), drive())

    async def queue(self, *frames: Any) -> None:
        for frame in frames:
            await self.worker.queue_frame(frame)

    async def until(self, kind: type, after: int = 0) -> Any:
        while True:
            for frame in self.frames[after:]:
                if isinstance(frame, kind):
                    return frame
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), TURN_TIMEOUT_S)

    def errors(self) -> list[Any]:
        from pipecat.frames.frames import ErrorFrame

        return [f for f in self.frames if isinstance(f, ErrorFrame)]

    def text(self, after: int = 0) -> str:
        from pipecat.frames.frames import LLMTextFrame

        return "".join(f.text for f in self.frames[after:] if isinstance(f, LLMTextFrame))

    def audio_bytes(self, after: int = 0) -> int:
        from pipecat.frames.frames import TTSAudioRawFrame

        return sum(len(f.audio) for f in self.frames[after:] if isinstance(f, TTSAudioRawFrame))


def _audio_frames(pcm16: bytes) -> list[Any]:
    from pipecat.frames.frames import InputAudioRawFrame

    chunk = INPUT_RATE_HZ // 10 * 2  # 100 ms
    return [
        InputAudioRawFrame(audio=pcm16[i : i + chunk], sample_rate=INPUT_RATE_HZ, num_channels=1)
        for i in range(0, len(pcm16), chunk)
    ]


def test_pipecat_text_turn_and_audio_turn_with_server_vad(server_url: str, tmp_path: Path) -> None:
    from pipecat.frames.frames import (
        LLMContextFrame,
        LLMFullResponseEndFrame,
        TranscriptionFrame,
    )
    from pipecat.processors.aggregators.llm_context import LLMContext

    question = spoken("What do cats like to eat?", tmp_path / "q.wav", silence_after_s=1.5)
    context = LLMContext(messages=[{"role": "user", "content": "What is the capital of France?"}])

    async def script(pipecat: Pipecat) -> None:
        await pipecat.queue(LLMContextFrame(context=context))
        await pipecat.until(LLMFullResponseEndFrame)
        assert "paris" in pipecat.text().lower()
        assert pipecat.audio_bytes() > 0
        mark = len(pipecat.frames)
        await pipecat.queue(*_audio_frames(question))
        transcription = await pipecat.until(TranscriptionFrame, mark)
        assert "cat" in transcription.text.lower()
        await pipecat.until(LLMFullResponseEndFrame, mark)
        assert pipecat.text(mark)
        assert pipecat.audio_bytes(mark) > 0
        assert pipecat.errors() == []

    asyncio.run(Pipecat(server_url, context).run(script))


def test_pipecat_barge_in_truncates_the_answer(server_url: str, tmp_path: Path) -> None:
    from pipecat.frames.frames import (
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMTextFrame,
        TranscriptionFrame,
        TTSAudioRawFrame,
    )
    from pipecat.processors.aggregators.llm_context import LLMContext

    interruption = spoken("Wait, tell me about dogs.", tmp_path / "i.wav", silence_after_s=1.5)
    ask = "Tell me a long story about a cat."
    context = LLMContext(messages=[{"role": "user", "content": ask}])
    sent: list[dict[str, Any]] = []

    async def script(pipecat: Pipecat) -> None:
        send = pipecat.service.send_client_event

        async def recording(event: Any) -> None:
            sent.append(event.model_dump(exclude_none=True))
            await send(event)

        pipecat.service.send_client_event = recording  # type: ignore[method-assign]
        await pipecat.queue(LLMContextFrame(context=context))
        await pipecat.until(TTSAudioRawFrame)
        mark = len(pipecat.frames)
        await pipecat.queue(*_audio_frames(interruption))
        transcription = await pipecat.until(TranscriptionFrame, mark)
        assert "dog" in transcription.text.lower()
        # the user's turn gets its own answer after the barge-in
        heard = pipecat.frames.index(transcription)
        await pipecat.until(LLMTextFrame, heard)
        await pipecat.until(LLMFullResponseEndFrame, heard)
        assert pipecat.errors() == []

    asyncio.run(Pipecat(server_url, context).run(script))
    truncates = [e for e in sent if e["type"] == "conversation.item.truncate"]
    assert len(truncates) == 1
    assert truncates[0]["audio_end_ms"] >= 0


def test_pipecat_tool_round_trip_with_required_tool_choice(server_url: str) -> None:
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import (
        FunctionCallResultFrame,
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMTextFrame,
        LLMUpdateSettingsFrame,
    )
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.services.openai.realtime.events import SessionProperties
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

    weather = FunctionSchema(
        name="get_weather",
        description="The current weather in a city.",
        properties=WEATHER_SCHEMA["properties"],  # type: ignore[arg-type]
        required=["city"],
    )
    context = LLMContext(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=ToolsSchema(standard_tools=[weather]),
    )
    calls: list[dict[str, Any]] = []

    def choice(mode: str) -> Any:
        properties = SessionProperties(tool_choice=mode)  # type: ignore[arg-type]
        return OpenAIRealtimeLLMService.Settings(session_properties=properties)

    async def script(pipecat: Pipecat) -> None:
        async def get_weather(params: Any) -> None:
            calls.append(dict(params.arguments))
            await pipecat.queue(LLMUpdateSettingsFrame(delta=choice("none")))  # now answer
            await params.result_callback({"city": params.arguments["city"], "temperature_c": 21})

        pipecat.service.register_function("get_weather", get_weather)
        # Pipecat's first session.update carries tool_choice "required" before the tools.
        await pipecat.queue(LLMUpdateSettingsFrame(delta=choice("required")))
        await pipecat.queue(LLMContextFrame(context=context))
        result = await pipecat.until(FunctionCallResultFrame)
        after = pipecat.frames.index(result)
        await pipecat.until(LLMTextFrame, after)
        await pipecat.until(LLMFullResponseEndFrame, after)
        assert pipecat.errors() == []

    asyncio.run(Pipecat(server_url, context).run(script))
    [arguments] = calls
    assert set(arguments) == {"city"}
