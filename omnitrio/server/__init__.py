"""The web layer: an OpenAI-compatible HTTP and Realtime WebSocket server."""

from .._listen import BindError as BindError
from ._app import create_app as create_app
from ._serve import bound_sockets as bound_sockets
from ._serve import serve as serve
from ._settings import ServerSettings as ServerSettings
from ._settings import SettingsError as SettingsError
from ._state import ServerState as ServerState

__all__ = [
    "BindError",
    "ServerSettings",
    "ServerState",
    "SettingsError",
    "bound_sockets",
    "create_app",
    "serve",
]
