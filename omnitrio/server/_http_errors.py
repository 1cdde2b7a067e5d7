"""The HTTP API's errors, in OpenAI's shape, and its one admission check.

Every endpoint that opens a pipeline stream looks with ``admit`` first (an immediate
503 with Retry-After when the pipeline is full or the server is draining, a 429 when
the client holds its share of the streams, ``_shares.py``: a streamed body cannot
change its status later) and answers a refusal that comes in
the narrow race after that look with ``refused``.
"""

from __future__ import annotations

import json
import math

from quart import Response

from .._errors import Overloaded, PipelineClosed
from ._requests import BadRequest
from ._shares import ShareExceeded
from ._state import Busy, ServerState, retry_after_s


def error_response(status: int, message: str, code: str, param: str | None = None) -> Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    response = Response(json.dumps(body), status=status, mimetype="application/json")
    if status in (429, 503):
        response.headers["Retry-After"] = "1"
    return response


def bad_request(exc: BadRequest) -> Response:
    return error_response(exc.status, str(exc), exc.code, exc.param)


def admit(state: ServerState, client: str) -> Response | None:
    """None when a stream may open now; else the 503 (pipeline full, or draining) or
    the 429 (``client`` holds its share of the streams)."""
    reason = state.busy()
    if reason is not None:
        return _busy(state, reason)
    try:
        state.shares.check_stream(client)
    except ShareExceeded as exc:
        return over_share(state, exc)
    return None


def over_share(state: ServerState, exc: ShareExceeded) -> Response:
    """429 naming the per-client limit the client reached."""
    state.refusals.labels(exc.setting.removeprefix("max_").removesuffix("_per_client")).inc()
    return error_response(429, str(exc), "rate_limit_exceeded", exc.setting)


def refused(state: ServerState, exc: Overloaded | PipelineClosed) -> Response:
    """The 503 for a stream the pipeline refused after ``admit`` let it through."""
    return _busy(state, "overloaded" if isinstance(exc, Overloaded) else "draining")


def _busy(state: ServerState, reason: Busy) -> Response:
    refusal = state.refuse(reason)
    response = error_response(503, str(refusal), "server_overloaded")
    # The pipeline's estimate (whole seconds, >= 1), as the Realtime API's retry_after_ms.
    response.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s(refusal))))
    return response
