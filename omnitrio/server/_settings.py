"""Server settings: where to listen, who may connect, and the limits per connection."""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass, field

API_KEY_ENV = "OMNITRIO_API_KEY"


class SettingsError(ValueError):
    """The server settings are unusable; the message says which setting and the fix."""


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    """Extra browser origins allowed besides the server's own (``*`` allows any)."""
    grace_period_s: float = 2.0
    """On SIGINT/SIGTERM: how long in-flight responses may finish before they are cancelled."""
    send_timeout_s: float = 10.0
    """A client that reads nothing for this long is disconnected (close code 1008)."""
    max_message_bytes: int = 1 << 20
    """A WebSocket message over this is refused with close 1009 before it is buffered."""
    close_linger_s: float = 2.0
    """After the server fails a WebSocket (1009, protocol error): how long it reads and
    discards, waiting for the client's close reply, before it hangs up."""
    max_input_audio_s: float = 60.0
    max_session_s: float = 3600.0
    output_sample_rate_hz: int = 24000
    outbound_capacity: int = 64
    """Server events queued per connection before its response stops reading the pipeline."""
    web_dir: str = field(default_factory=lambda: default_web_dir())

    def __post_init__(self) -> None:
        if self.api_key is None and not _is_loopback(self.host):
            raise SettingsError(
                f"--host {self.host} is not a loopback address, so an API key is required; "
                f"pass --api-key or set {API_KEY_ENV}"
            )
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"--port {self.port} is not a TCP port (0-65535)")
        for name in (
            "grace_period_s",
            "send_timeout_s",
            "close_linger_s",
            "max_input_audio_s",
            "max_session_s",
        ):
            if not 0 < getattr(self, name) < math.inf:  # NaN fails too
                raise SettingsError(
                    f"{name} must be positive and finite, not {getattr(self, name)}"
                )

    @classmethod
    def from_env(cls, **overrides: object) -> ServerSettings:
        """Settings with the API key taken from ``OMNITRIO_API_KEY`` unless given."""
        if overrides.get("api_key") is None and os.environ.get(API_KEY_ENV):
            overrides["api_key"] = os.environ[API_KEY_ENV]
        return cls(**overrides)  # type: ignore[arg-type]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_web_dir() -> str:
    """``web/`` beside the package in a checkout."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "web")
