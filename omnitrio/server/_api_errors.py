"""The HTTP API's errors as data, in OpenAI's shape: no web framework, no counters.

``ApiError`` is one error answer (status, message, OpenAI's ``code``, the field it
names, the retry hint); ``body()`` and ``headers()`` are what goes on the wire. The
functions below map each way a request fails to one: a bad body (``BadRequest``),
a client over its share (429), a pipeline that refused the stream (503), a stream
that failed (500). _http_errors.py turns them into responses and counts the
refusals; this module is tested without a server (tests/server/test_api_errors.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .._errors import OmnitrioError, Overloaded
from ._requests import BadRequest
from ._shares import ShareExceeded

DEFAULT_RETRY_AFTER_S = 1.0
"""The retry hint when the pipeline gives no estimate of its own."""


def retry_after_s(refusal: Overloaded | None) -> float:
    """When a refused client may retry: the pipeline's estimate, else 1 s."""
    if refusal is None or refusal.retry_after_s is None:
        return DEFAULT_RETRY_AFTER_S
    return refusal.retry_after_s


@dataclass(frozen=True)
class ApiError:
    """One error answer. ``retry_after_s``: sent as Retry-After (whole seconds, at least
    1); a 429 or 503 without one says 1."""

    status: int
    message: str
    code: str
    param: str | None = None
    retry_after_s: float | None = None

    @property
    def type(self) -> str:
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param}
        return json.dumps({"error": {**error, "code": self.code}}).encode()

    def headers(self) -> dict[str, str]:
        retry_s = self.retry_after_s
        if retry_s is None and self.status in (429, 503):
            retry_s = DEFAULT_RETRY_AFTER_S
        return {} if retry_s is None else {"Retry-After": str(max(1, math.ceil(retry_s)))}


def bad_request_error(exc: BadRequest) -> ApiError:
    """The answer to a body refused by _requests.py (400, naming the field)."""
    return ApiError(exc.status, str(exc), exc.code, exc.param)


def share_error(exc: ShareExceeded) -> ApiError:
    """429 naming the per-client limit the client reached, with its retry hint."""
    return ApiError(429, str(exc), "rate_limit_exceeded", exc.setting, exc.retry_after_s)


def busy_error(refusal: Overloaded) -> ApiError:
    """503 for a full or draining pipeline, with the pipeline's retry estimate (the
    Realtime API's ``retry_after_ms``)."""
    return ApiError(503, str(refusal), "server_overloaded", retry_after_s=retry_after_s(refusal))


def pipeline_error(exc: OmnitrioError) -> ApiError:
    """500 for a stream the pipeline failed after it was admitted."""
    return ApiError(500, str(exc), "pipeline_error")


def needs_pyav_error(param: str, value: str) -> ApiError:
    """501 for an audio format this install cannot encode (PyAV is the voice extra)."""
    message = f"{param} {value!r} needs PyAV (the voice extra)"
    return ApiError(501, message, "not_implemented", param)


def stream_error_chunk(exc: OmnitrioError) -> bytes:
    """The SSE event that ends a streamed answer the pipeline failed mid-way (the status,
    200, is sent by then)."""
    error = {"error": {"message": str(exc), "type": "server_error"}}
    return f"data: {json.dumps(error)}\n\n".encode()


@dataclass(frozen=True)
class Refused(ApiError, Exception):
    """An ``ApiError`` raised: where the refusal is found deep in a request's handling
    (a WebRTC call's offer, a client secret) and answered at its top."""

    @classmethod
    def of(cls, error: ApiError) -> Refused:
        return cls(error.status, error.message, error.code, error.param, error.retry_after_s)
