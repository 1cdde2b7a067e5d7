"""The web layer: an OpenAI-compatible HTTP and Realtime WebSocket server."""

from ._app import create_app as create_app
from ._serve import serve as serve
from ._settings import ServerSettings as ServerSettings
from ._settings import SettingsError as SettingsError
from ._state import ServerState as ServerState

__all__ = ["ServerSettings", "ServerState", "SettingsError", "create_app", "serve"]
