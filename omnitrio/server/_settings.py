"""Server settings: where to listen, who may connect, and the limits per connection."""

from __future__ import annotations

import ipaddress
import math
import os
import resource
from dataclasses import dataclass, field

from ..tools import ToolLimits

API_KEY_ENV = "OMNITRIO_API_KEY"
FD_RESERVE = 64
"""File descriptors kept free of client connections: the listening socket, logs, model
files, the threads' wakeup pipes, and the refusals themselves."""


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
    """Input audio longer than this is refused, on every path (Realtime buffer, chat audio)."""
    min_input_sample_rate_hz: int = 8000
    max_input_sample_rate_hz: int = 96000
    """Uploaded audio (a WAV header) must declare a rate in this range: a rate of 100 Hz
    would resample 1 MB into an hour of audio, a rate of 0 is no rate."""
    max_session_s: float = 3600.0
    output_sample_rate_hz: int = 24000
    outbound_capacity: int = 64
    """Server events queued per connection before its response stops reading the pipeline."""
    max_connections: int = 1000
    """Open TCP connections (idle ones included) the server holds; one more is answered
    503 and closed at once. Lowered at start to the process's file-descriptor limit
    minus ``FD_RESERVE`` (``effective_max_connections``), so it never runs out of fds."""
    max_frame_values: int = 20_000
    """A Realtime message holding more arrays, maps and elements than this is refused
    with an error event before (JSON) or while (msgpack) it is decoded: decoding runs on
    the event loop, and a megabyte of empty maps took ~80 ms, delaying every client."""
    max_tools: int = 128
    """Function tools in one request (chat ``tools``, Realtime session or response
    ``tools``); each one's schema is compiled to check it (~1 ms a tool, off the event
    loop). OpenAI's own limit."""
    max_tools_bytes: int = 256 * 1024
    """The tools of one request as JSON (names, descriptions, schemas)."""
    max_output_tokens: int = 4096
    """A chat's ``max_tokens`` / ``max_completion_tokens`` above this is refused (400
    naming the cap): every token's KV cache is memory the stream holds to its end."""
    max_streams_per_client: int | None = None
    """Pipeline streams one client (connection address) may hold at once; None: half the
    pipeline's ``max_streams`` (at least 1). One more is refused (429) naming it."""
    max_queued_per_client: int = 2
    """Requests one client may have waiting for, or in, the checking threads (body
    parsing, tool schema compilation, audio decoding run off the event loop)."""
    max_checking_threads: int = 2
    """Threads that check requests off the event loop, taken in arrival order."""
    max_connections_per_client: int | None = None
    """Open connections one client (connection address) may hold; None: a sixteenth of
    ``max_connections`` (at least 8). One more is answered 429 naming it."""
    # Per-client totals across sessions (omnitrio/server/_client_totals.py, _idle_sessions.py).
    max_client_held_bytes: int = 32 << 20
    """What one client's Realtime sessions may hold of its input together (audio, items,
    instructions); an event that would add past it is refused (``client_memory_full``)."""
    max_sessions_per_key: int | None = None
    """Realtime WebSocket sessions open at once with one API key; None: not counted by key
    (the server's one key is usually shared by every backend holding it). One more: 1013."""
    crowded_idle_s: float = 30.0
    """While the server holds 90 % of its connections, a session idle this long is closed."""
    decode_timeout_s: float = 20.0
    """An uploaded file's decode (its own process) that takes longer is stopped and refused."""
    h2c: bool = False
    """HTTP/2 over cleartext (prior knowledge or ``Upgrade: h2c``). Off by default: the
    h2 stack buffers whole responses for a peer that keeps its flow-control window shut,
    which the per-write send deadline cannot see (``docs/reliability.md``)."""
    web_dir: str = field(default_factory=lambda: default_web_dir())
    # WebRTC calls (POST /v1/realtime/calls; omnitrio/server/_calls.py).
    max_calls: int = 64
    """WebRTC calls up at once; one more is refused (503). Each holds a session, a
    peer connection and its UDP socket, as a WebSocket connection holds its session."""
    webrtc_connect_timeout_s: float = 10.0
    """A call whose peer has not connected (ICE, DTLS, the data channel) by then is released."""
    webrtc_media_timeout_s: float = 1.5
    """A connected call whose caller sent no audio for this long is released: the peer
    went away without a word (browsers send silence, not nothing, while muted)."""
    webrtc_input_prefetch_frames: int = 0
    """Received audio frames a call's microphone is held for before the first is heard
    (20 ms each). aiortc's own is 4 (a fixed 80 ms on every turn's end); 0 hears each
    packet as it arrives and drops one that comes after a later one (a loopback or LAN
    never reorders); 1 or more waits for that many later frames (aiortc's buffer)."""
    webrtc_playout_s: float = 10.0
    """The answer's audio a call holds ahead of what it has played: past this a response
    waits (its stream's credits run out), as for a slow WebSocket reader."""
    client_secret_s: int = 600
    """An ephemeral client secret's default lifetime (``expires_after.seconds`` overrides:
    10 s to 2 h)."""
    max_client_secrets: int = 10_000
    """Unexpired client secrets held at once; one more is refused (429)."""

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
            "webrtc_connect_timeout_s",
            "webrtc_media_timeout_s",
            "webrtc_playout_s",
            "crowded_idle_s",
            "decode_timeout_s",
        ):
            if not 0 < getattr(self, name) < math.inf:  # NaN fails too
                raise SettingsError(
                    f"{name} must be positive and finite, not {getattr(self, name)}"
                )

        if not 0 < self.min_input_sample_rate_hz <= self.max_input_sample_rate_hz:
            raise SettingsError(
                "min_input_sample_rate_hz must be positive and at most max_input_sample_rate_hz, "
                f"not {self.min_input_sample_rate_hz} and {self.max_input_sample_rate_hz}"
            )
        for name in (
            "max_connections",
            "max_frame_values",
            "max_tools",
            "max_tools_bytes",
            "max_output_tokens",
            "max_queued_per_client",
            "max_checking_threads",
            "max_calls",
            "client_secret_s",
            "max_client_secrets",
            "max_client_held_bytes",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be at least 1, not {getattr(self, name)}")

        if self.webrtc_input_prefetch_frames < 0:
            raise SettingsError(
                "webrtc_input_prefetch_frames must be at least 0, "
                f"not {self.webrtc_input_prefetch_frames}"
            )
        if self.max_connections_per_client is not None and self.max_connections_per_client < 1:
            raise SettingsError(
                "max_connections_per_client must be at least 1 (or None), "
                f"not {self.max_connections_per_client}"
            )
        if self.max_sessions_per_key is not None and self.max_sessions_per_key < 1:
            raise SettingsError(
                "max_sessions_per_key must be at least 1 (or None), "
                f"not {self.max_sessions_per_key}"
            )
        if self.max_streams_per_client is not None and self.max_streams_per_client < 1:
            raise SettingsError(
                f"max_streams_per_client must be at least 1 (or None), "
                f"not {self.max_streams_per_client}"
            )

    @property
    def tool_limits(self) -> ToolLimits:
        return ToolLimits(max_tools=self.max_tools, max_tools_bytes=self.max_tools_bytes)

    def streams_per_client(self, max_streams: int) -> int:
        """``max_streams_per_client``, or half the pipeline's ``max_streams`` (at least 1)."""
        if self.max_streams_per_client is not None:
            return self.max_streams_per_client
        return max(1, (max_streams + 1) // 2)

    @classmethod
    def from_env(cls, **overrides: object) -> ServerSettings:
        """Settings with the API key taken from ``OMNITRIO_API_KEY`` unless given."""
        if overrides.get("api_key") is None and os.environ.get(API_KEY_ENV):
            overrides["api_key"] = os.environ[API_KEY_ENV]
        return cls(**overrides)  # type: ignore[arg-type]


def effective_max_connections(settings: ServerSettings) -> int:
    """``max_connections``, lowered to what the file-descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return settings.max_connections
    return max(1, min(settings.max_connections, soft - FD_RESERVE))


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
