"""The HTTP API's errors as data (omnitrio/server/_api_errors.py), without a server:
OpenAI's error shape, the field named, and the retry hint of every refusal."""

from __future__ import annotations

import json

from omnitrio._errors import Overloaded, StageError
from omnitrio.server._api_errors import (
    ApiError,
    bad_request_error,
    busy_error,
    needs_pyav_error,
    pipeline_error,
    share_error,
    stream_error_chunk,
)
from omnitrio.server._requests import BadRequest
from omnitrio.server._shares import ShareExceeded


def test_an_error_is_openais_shape_naming_the_field() -> None:
    error = bad_request_error(BadRequest("temperature: too hot", "temperature", "invalid_value"))
    assert error.status == 400
    assert json.loads(error.body()) == {
        "error": {
            "message": "temperature: too hot",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    assert error.headers() == {}  # no retry hint: the same request fails again


def test_server_errors_are_typed_as_such() -> None:
    failed = pipeline_error(StageError("llm", "stream-1", "out of memory"))
    assert failed.status == 500
    assert json.loads(failed.body())["error"]["type"] == "server_error"
    missing = needs_pyav_error("response_format", "mp3")
    assert (missing.status, missing.param) == (501, "response_format")
    assert "PyAV" in missing.message


def test_a_full_pipeline_says_when_to_retry_in_whole_seconds() -> None:
    error = busy_error(Overloaded(4, retry_after_s=2.3))
    assert (error.status, error.code) == (503, "server_overloaded")
    assert error.headers() == {"Retry-After": "3"}
    assert busy_error(Overloaded(4, retry_after_s=0.01)).headers() == {"Retry-After": "1"}
    assert busy_error(Overloaded(4)).headers() == {"Retry-After": "1"}  # no estimate: 1 s


def test_a_client_over_its_share_is_a_429_with_the_same_hint_as_realtime() -> None:
    exc = ShareExceeded("max_streams_per_client", 2, "streams open")
    error = share_error(exc)
    assert (error.status, error.code, error.param) == (429, "rate_limit_exceeded", exc.setting)
    assert error.headers() == {"Retry-After": "1"}
    assert exc.retry_after_s == 1.0  # what a Realtime response.done says in retry_after_ms


def test_any_429_or_503_carries_retry_after() -> None:
    assert ApiError(503, "draining", "server_overloaded").headers() == {"Retry-After": "1"}
    assert ApiError(404, "no such file", "not_found").headers() == {}


def test_a_stream_that_fails_mid_way_ends_with_an_error_event() -> None:
    chunk = stream_error_chunk(StageError("tts", "stream-1", "boom"))
    assert chunk.startswith(b"data: ")
    assert chunk.endswith(b"\n\n")
    error = json.loads(chunk.removeprefix(b"data: "))["error"]
    assert error["type"] == "server_error"
    assert "boom" in error["message"]
