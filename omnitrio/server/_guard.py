"""Who may use the server: API key and browser-origin checks, shared by HTTP and WebSocket."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from werkzeug.datastructures import Headers

from ._settings import ServerSettings

INSECURE_KEY_PREFIX = "openai-insecure-api-key."
"""Browsers cannot set headers on a WebSocket, so they pass the key as a subprotocol
(the convention the OpenAI Realtime API uses)."""


def key_ok(settings: ServerSettings, headers: Headers, subprotocols: list[str]) -> bool:
    """True when no key is configured or the request carries the right one."""
    if settings.api_key is None:
        return True
    offered = [headers.get("Authorization", "").removeprefix("Bearer ").strip()]
    offered += [
        p.removeprefix(INSECURE_KEY_PREFIX)
        for p in subprotocols
        if p.startswith(INSECURE_KEY_PREFIX)
    ]
    expected = settings.api_key.encode()
    return any(hmac.compare_digest(k.encode(), expected) for k in offered if k)


def origin_ok(settings: ServerSettings, headers: Headers) -> bool:
    """Browser requests (they send Origin) must come from this server or an allowed origin."""
    origin = headers.get("Origin")
    if origin is None or "*" in settings.allowed_origins or origin in settings.allowed_origins:
        return True
    host = headers.get("Host", "")
    return urlsplit(origin).netloc == host
