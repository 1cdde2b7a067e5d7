"""A speech body, parsed and checked, and its audio as the wire shows it: no sockets.

``prepare_speech`` turns the raw ``POST /v1/audio/speech`` body into a ``SpeechCall``
(the checked body and its pipeline request, task ``speak``: say the input as it is)
or raises ``BadRequest`` naming the field. ``SpeechAudio`` turns the stream's audio
chunks into the bytes of the response body, resampled to the server's output rate and
encoded in the asked format as one continuous file. Tested without a server
(tests/server/test_speech.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._items import AudioChunk, Request, VisibleItem
from .._options import ResponseOptions
from ._audio import resample_pcm16
from ._capabilities import Voices
from ._requests import BadRequest, SpeechRequest, parse_json
from ._speech_formats import MIMETYPES, SpeechEncoder


@dataclass(frozen=True)
class SpeechCall:
    """A checked speech body and the pipeline request it asks for."""

    speech: SpeechRequest
    request: Request

    @property
    def mimetype(self) -> str:
        return MIMETYPES[self.speech.response_format]


def prepare_speech(raw: bytes, voices: Voices) -> SpeechCall:
    """The body parsed and checked, and its pipeline request. Raises ``BadRequest``."""
    speech = parse_json(SpeechRequest, raw)
    why = voices.check(speech.voice)
    if why is not None:
        raise BadRequest(f"voice: {why}", "voice", "invalid_value")
    # task "speak": say ``input`` as it is (a pipeline that answers would answer it instead).
    options = ResponseOptions(modalities=("audio",), voice=speech.voice, task="speak")
    return SpeechCall(speech, Request(text=speech.input, options=options))


class SpeechAudio:
    """The response body of one speech call, item by item. Raises ``ImportError`` for an
    encoded format on an install without PyAV."""

    def __init__(self, call: SpeechCall, rate_hz: int) -> None:
        self.rate_hz = rate_hz
        self._encoder = SpeechEncoder(call.speech.response_format, rate_hz)

    def take(self, item: VisibleItem) -> bytes:
        """The body's next bytes for one pipeline item (none for text and events, and
        none yet while the encoder fills a frame)."""
        if not isinstance(item, AudioChunk):
            return b""
        return self._encoder.feed(resample_pcm16(item.pcm16, item.sample_rate_hz, self.rate_hz))

    def close(self) -> bytes:
        """The body's last bytes, after the stream's end."""
        return self._encoder.close()
