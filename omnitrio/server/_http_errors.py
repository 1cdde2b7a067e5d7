"""The HTTP API's errors as responses, and its one admission check.

The errors themselves are data (``ApiError``, _api_errors.py); this module puts them
on the wire as quart responses and counts the refusals in the server's metrics.
Every endpoint that opens a pipeline stream looks with ``admit`` first (an immediate
503 with Retry-After when the pipeline is full or the server is draining, a 429 when
the client holds its share of the streams, ``_shares.py``: a streamed body cannot
change its status later) and answers a refusal that comes in the narrow race after
that look with ``failure``.
"""

from __future__ import annotations

from quart import Response

from .._errors import OmnitrioError, Overloaded, PipelineClosed
from .._items import Request
from ._api_errors import ApiError, bad_request_error, busy_error, pipeline_error, share_error
from ._requests import BadRequest
from ._shares import ShareExceeded
from ._state import ServerState


def respond(error: ApiError) -> Response:
    """``error`` as a JSON response in OpenAI's error shape."""
    response = Response(error.body(), status=error.status, mimetype="application/json")
    response.headers.update(error.headers())
    return response


def error_response(status: int, message: str, code: str, param: str | None = None) -> Response:
    return respond(ApiError(status, message, code, param))


def bad_request(exc: BadRequest) -> Response:
    return respond(bad_request_error(exc))


def admit(state: ServerState, client: str, request: Request) -> Response | None:
    """None when a stream for ``request`` may open now; else the 503 (the pipeline
    would refuse ``request`` at once: asked for its kind, so a transcription is not
    refused for the audio streams' room; or draining) or the 429 (``client`` holds its
    share of the streams)."""
    reason = state.busy(request)
    if reason is not None:
        return respond(busy_error(state.refuse(reason, request)))
    try:
        state.shares.check_stream(client)
    except ShareExceeded as exc:
        return over_share(state, exc)
    return None


def over_share(state: ServerState, exc: ShareExceeded) -> Response:
    """429 naming the per-client limit the client reached."""
    state.refusals.labels(exc.setting.removeprefix("max_").removesuffix("_per_client")).inc()
    return respond(share_error(exc))


def failure(state: ServerState, exc: OmnitrioError) -> Response:
    """The answer to a stream that failed before its status was sent: the 503 or 429
    for one refused after ``admit`` let it through (a race), else a 500."""
    if isinstance(exc, Overloaded):  # the pipeline's own refusal, with its hint
        return respond(busy_error(state.refuse("overloaded", refusal=exc)))
    if isinstance(exc, PipelineClosed):
        return respond(busy_error(state.refuse("draining")))
    if isinstance(exc, ShareExceeded):
        return over_share(state, exc)
    return respond(pipeline_error(exc))
