"""The HTTP side of WebRTC calls: ``POST /v1/realtime/calls`` (and the beta form,
``POST /v1/realtime?model=...``), ``POST /v1/realtime/calls/{id}/hangup`` and
``POST /v1/realtime/client_secrets``, in OpenAI's shapes.

A call's offer comes as the body (``Content-Type: application/sdp``) or as the
multipart form OpenAI's SDKs send (an ``sdp`` part and an optional ``session`` part
holding a JSON session object). The answer is ``201`` with the SDP answer
(``application/sdp``) and ``Location: /v1/realtime/calls/{call_id}``. Errors are JSON
in OpenAI's error shape, as everywhere.
"""

from __future__ import annotations

import json

from quart import Response, request

from ._api_errors import Refused
from ._calls import Calls, session_shown
from ._guard import bearer_token
from ._http_errors import error_response, respond
from ._secrets import ClientSecret
from ._shares import client_of
from ._state import ServerState

CALLS_PATH = "/v1/realtime/calls"
SECRET_PATHS = frozenset({CALLS_PATH, "/v1/realtime"})
"""Where an ephemeral client secret stands in for the API key (making a call)."""


def call_secret(state: ServerState) -> ClientSecret | None:
    """The unexpired client secret this request's bearer token is, on a path that takes
    one (making a call), else None."""
    if request.method != "POST" or request.path not in SECRET_PATHS:
        return None
    return state.secrets.find(bearer_token(request.headers.get("Authorization", "")))


async def create_call(state: ServerState, beta: bool) -> Response:
    calls = state.calls
    if not isinstance(calls, Calls):
        return error_response(503, "the server is not taking calls", "calls_unavailable")
    try:
        offer, session = await _offer_and_session()
        secret = call_secret(state)
        call_id, answer = await calls.create(
            offer,
            session,
            beta,
            client_of(request.remote_addr),
            None if secret is None else secret.session,
        )
    except Refused as error:
        return respond(error)
    response = Response(answer, status=201, mimetype="application/sdp")
    response.headers["Location"] = f"{CALLS_PATH}/{call_id}"
    return response


async def _offer_and_session() -> tuple[str, object | None]:
    kind = request.mimetype
    if kind == "application/sdp":
        body = await request.get_data(as_text=False)
        return _text(body if isinstance(body, bytes) else body.encode(), "sdp"), None
    if kind != "multipart/form-data":
        message = (
            "send the SDP offer as the body (Content-Type: application/sdp) or as the "
            f"multipart form's sdp part, not {kind or 'no Content-Type'}"
        )
        raise Refused(400, message, "invalid_content_type")
    form, files = await request.form, await request.files
    parts = {name: form[name] for name in ("sdp", "session") if name in form}
    for name in ("sdp", "session"):
        if name not in parts and name in files:
            parts[name] = _text(files[name].read(), name)
    if "sdp" not in parts:
        raise Refused(400, "missing required parameter sdp", "missing_required_parameter", "sdp")
    session: object | None = None
    if "session" in parts:
        try:
            session = json.loads(parts["session"])
        except ValueError:
            raise Refused(400, "session must be a JSON object", "invalid_json", "session") from None
        if not isinstance(session, dict):
            raise Refused(400, "session must be a JSON object", "invalid_type", "session")
    return parts["sdp"], session


def _text(data: bytes, param: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise Refused(400, f"{param} is not UTF-8 text", "invalid_value", param) from None


async def hang_up(state: ServerState, call_id: str) -> Response:
    calls = state.calls
    if not isinstance(calls, Calls) or not calls.hang_up(call_id):
        return error_response(404, f"no call {call_id[:64]!r} is up", "call_not_found")
    return Response("", status=200)


async def create_client_secret(state: ServerState) -> Response:
    body = await request.get_data(as_text=False)
    try:
        params = json.loads(body or b"{}")
    except ValueError:
        return error_response(400, "the body must be a JSON object", "invalid_json")
    if not isinstance(params, dict):
        return error_response(400, "the body must be a JSON object", "invalid_type")
    expires = params.get("expires_after") or {}
    session = params.get("session")
    try:
        if not isinstance(expires, dict):
            raise Refused(400, "expires_after must be an object", "invalid_type", "expires_after")
        if expires.get("anchor", "created_at") != "created_at":
            message = "expires_after.anchor must be created_at"
            raise Refused(400, message, "invalid_value", "expires_after.anchor")
        shown = session_shown(state, session)
        secret = state.secrets.create(expires.get("seconds"), session)
    except Refused as error:
        return respond(error)
    body_out = {"value": secret.value, "expires_at": secret.expires_at, "session": shown}
    return Response(json.dumps(body_out), mimetype="application/json")
