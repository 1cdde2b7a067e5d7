"""Ephemeral client secrets (``POST /v1/realtime/client_secrets``): a browser gets a
short-lived key for ``POST /v1/realtime/calls`` from the application's own backend,
which holds the server's API key, so the page never sees that key.

A secret is a random ``ek_`` token with an expiry and, optionally, a session object
that every call made with it starts from. Held in memory, at most
``max_client_secrets`` unexpired ones (one more is refused with a 429); expired ones
are forgotten as new ones are made.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

from ._api_errors import Refused

PREFIX = "ek_"
MIN_SECONDS, MAX_SECONDS = 10, 7200


@dataclass(frozen=True)
class ClientSecret:
    value: str
    expires_at: int  # seconds since the epoch
    session: object | None  # a session object calls made with it start from


class ClientSecrets:
    """The server's unexpired client secrets."""

    def __init__(self, default_s: int, max_secrets: int) -> None:
        self._default_s = default_s
        self._max = max_secrets
        self._secrets: dict[str, ClientSecret] = {}

    def create(self, seconds: object, session: object | None) -> ClientSecret:
        """A new secret living ``seconds`` (None: the default); ``Refused`` if refused."""
        if seconds is None:
            seconds = self._default_s
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise Refused(
                400,
                "expires_after.seconds must be a whole number",
                "invalid_type",
                "expires_after.seconds",
            )
        if not MIN_SECONDS <= seconds <= MAX_SECONDS:
            message = f"expires_after.seconds must be from {MIN_SECONDS} to {MAX_SECONDS}"
            raise Refused(400, message, "invalid_value", "expires_after.seconds")
        now = time.time()
        self._secrets = {k: s for k, s in self._secrets.items() if s.expires_at > now}
        if len(self._secrets) >= self._max:
            message = f"{self._max} client secrets are unexpired (max_client_secrets); retry later"
            raise Refused(429, message, "too_many_client_secrets", retry_after_s=MIN_SECONDS)
        secret = ClientSecret(PREFIX + secrets.token_urlsafe(24), int(now) + seconds, session)
        self._secrets[secret.value] = secret
        return secret

    def find(self, value: str) -> ClientSecret | None:
        """The unexpired secret ``value`` names (compared in constant time), or None."""
        if not value.startswith(PREFIX):
            return None
        secret = self._secrets.get(value)
        if secret is None or not hmac.compare_digest(secret.value, value):
            return None
        if secret.expires_at <= time.time():
            del self._secrets[value]
            return None
        return secret
