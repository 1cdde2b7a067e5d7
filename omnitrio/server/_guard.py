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
    offered = [bearer_token(headers.get("Authorization", ""))]
    offered += [
        p.removeprefix(INSECURE_KEY_PREFIX)
        for p in subprotocols
        if p.startswith(INSECURE_KEY_PREFIX)
    ]
    expected = settings.api_key.encode()
    return any(hmac.compare_digest(k.encode(), expected) for k in offered if k)


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ('' if it is not one).

    The scheme is case-insensitive (RFC 9110 11.1: ``bearer`` is ``Bearer``); a bare
    token without the scheme is not a bearer credential and is refused."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_ok(settings: ServerSettings, headers: Headers) -> bool:
    """Without an API key the server only answers to its loopback names.

    A page on another site can point its own DNS name at 127.0.0.1 (DNS
    rebinding); its requests then carry that name in ``Host`` and in ``Origin``,
    so comparing the two proves nothing. Checking ``Host`` against the names
    this server is known by does. With an API key (any non-loopback bind has
    one) the key is the gate.
    """
    if settings.api_key is not None:
        return True
    hostname = _split(f"//{headers.get('Host', '')}")[1]
    return hostname in LOOPBACK_NAMES or hostname == settings.host


def origin_ok(settings: ServerSettings, headers: Headers) -> bool:
    """Browser requests (they send Origin) must come from this server or an allowed origin."""
    origin = headers.get("Origin")
    if origin is None or "*" in settings.allowed_origins or origin in settings.allowed_origins:
        return True
    return host_ok(settings, headers) and _split(origin)[0] == headers.get("Host", "")


def _split(url: str) -> tuple[str | None, str | None]:
    """(netloc, hostname) of ``url``; (None, None) when it does not parse (``Host: [``):
    a header that is not a URL matches nothing, it is not a server error."""
    try:
        parts = urlsplit(url)
        return parts.netloc, parts.hostname
    except ValueError:
        return None, None
