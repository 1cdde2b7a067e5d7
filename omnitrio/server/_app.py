"""The quart-trio application: routes only; the work lives in the modules they call."""

from __future__ import annotations

import json
import logging
import os

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response, request, send_from_directory, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..realtime import RealtimeSession, select_subprotocol
from ._calls_http import call_secret, create_call, create_client_secret, hang_up
from ._capabilities import pipeline_voices
from ._guard import host_ok, key_ok, origin_ok
from ._http_errors import error_response
from ._openai_http import chat_completions, speech
from ._realtime import RealtimeConnection, refuse_busy, session_config
from ._shares import client_of
from ._state import SESSION_LOOK, ServerState
from ._transcriptions import transcriptions

logger = logging.getLogger(__name__)
_HTTP_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}

MAX_STATIC_PATH = 1024
"""A longer path under /static/ names no file of web/static: a 404 without a look-up."""


def create_app(state: ServerState) -> QuartTrio:
    app = QuartTrio(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = state.settings.max_message_bytes
    # quart cuts every response at 60 s by default; long streams end with the session limit.
    app.config["RESPONSE_TIMEOUT"] = state.settings.max_session_s
    settings = state.settings

    @app.before_request
    async def guard_http() -> Response | None:
        if not host_ok(settings, request.headers):
            return error_response(421, "unknown Host; use a loopback address", "misdirected")
        if request.path in ("/health", "/") or request.path.startswith("/static/"):
            return None
        if not origin_ok(settings, request.headers):
            return error_response(403, "cross-origin requests are not allowed", "forbidden_origin")
        if not key_ok(settings, request.headers, []) and call_secret(state) is None:
            return error_response(401, "invalid or missing API key", "invalid_api_key")
        return None

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        # quart's own 404 / 405 / 413 ... as OpenAI-style JSON errors, like every other.
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = f"{request.method} {request.path}: {exc.name} ({exc.description})"
        response = error_response(status, message, code)
        if status == 405 and exc.get_headers():
            response.headers.update(dict(exc.get_headers()))
            response.headers["Content-Type"] = "application/json"
        return response

    @app.errorhandler(Exception)
    async def server_error(exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, f"internal server error ({type(exc).__name__})", "server_error")

    @app.get("/health")
    async def health() -> Response:
        stats = state.pipeline.statistics()
        stages = [*stats.stages.values(), *([stats.side_stage] if stats.side_stage else [])]
        hung = [s.name for s in stages if s.hung]
        status = "draining" if state.draining else "degraded" if hung else "ok"
        body = json.dumps({"status": status, "hung_stages": hung} if hung else {"status": status})
        return Response(body, status=503 if hung else 200, mimetype="application/json")

    @app.get("/v1/models")
    async def models() -> Response:
        body = (
            f'{{"object": "list", "data": [{{"id": "{state.model_name}", "object": "model", '
            f'"created": 0, "owned_by": "omnitrio"}}]}}'
        )
        return Response(body, mimetype="application/json")

    @app.get("/v1/audio/voices")
    async def voices() -> Response:
        listing = pipeline_voices(state.pipeline.config).listing()
        body = json.dumps({"object": "list", "data": listing})
        return Response(body, mimetype="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.registry), mimetype=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        return await chat_completions(state, await _body(), _client())

    @app.post("/v1/audio/speech")
    async def audio_speech() -> Response:
        return await speech(state, await _body(), _client())

    @app.post("/v1/audio/transcriptions")
    async def audio_transcriptions() -> Response:
        return await transcriptions(state, await request.form, await request.files, _client())

    @app.get("/")
    async def index() -> Response:
        return await send_from_directory(settings.web_dir, "index.html")

    @app.get("/static/<path:name>")
    async def static_file(name: str) -> Response:
        # send_from_directory joins safely: a path escaping web/ is a 404, and so is one
        # the file system cannot even look up (a name too long: ENAMETOOLONG).
        if len(name) > MAX_STATIC_PATH:
            return error_response(404, "no such file", "not_found")
        try:
            return await send_from_directory(os.path.join(settings.web_dir, "static"), name)
        except OSError:
            return error_response(404, "no such file", "not_found")

    @app.errorhandler(413)
    async def too_large(_: Exception) -> Response:
        limit = settings.max_message_bytes
        message = f"the request body is over the limit of {limit} bytes (max_message_bytes)"
        return error_response(413, message, "request_too_large")

    # WebRTC calls (_calls_http.py): OpenAI's Realtime API over a peer connection.
    @app.post("/v1/realtime/calls")
    async def realtime_call() -> Response:
        return await create_call(state, beta=False)

    @app.post("/v1/realtime")
    async def realtime_call_beta() -> Response:  # the beta form: ?model=..., an SDP body
        return await create_call(state, beta=True)

    @app.post("/v1/realtime/calls/<call_id>/hangup")
    async def realtime_hang_up(call_id: str) -> Response:
        return await hang_up(state, call_id)

    @app.post("/v1/realtime/client_secrets")
    async def realtime_client_secret() -> Response:
        return await create_client_secret(state)

    @app.websocket("/v1/realtime")
    async def realtime() -> Response | None:
        headers, offered = websocket.headers, websocket.requested_subprotocols
        if not host_ok(settings, headers):
            return error_response(421, "unknown Host; use a loopback address", "misdirected")
        if not origin_ok(settings, headers):
            return error_response(403, "cross-origin WebSocket refused", "forbidden_origin")
        if not key_ok(settings, headers, offered):
            return error_response(401, "invalid or missing API key", "invalid_api_key")
        framing, subprotocol = select_subprotocol(offered)  # the client's order decides
        beta = "realtime=v1" in headers.get("OpenAI-Beta", "")
        try:
            await websocket.accept(subprotocol=subprotocol)
        except Exception:
            # A peer that breaks the handshake (e.g. bytes after the upgrade request)
            # makes h11 raise here; it costs that connection only.
            logger.warning("realtime handshake failed", exc_info=True)
            return None
        reason = state.session_busy()  # each response is then admitted by its kind
        if reason is not None:  # an error event with retry_after_ms, then 1013
            session = RealtimeSession(session_config(state, framing, beta))
            await refuse_busy(websocket, session, state.refuse(reason, SESSION_LOOK))
            return None
        state.connections.inc()
        session = RealtimeSession(session_config(state, framing, beta))
        await RealtimeConnection(state, websocket, session, client_of(websocket.remote_addr)).run()
        return None

    return app


def _client() -> str:
    """Who is asking, for the per-client shares: the connection's address."""
    return client_of(request.remote_addr)


async def _body() -> bytes:
    data = await request.get_data(as_text=False)
    return data if isinstance(data, bytes) else data.encode()
