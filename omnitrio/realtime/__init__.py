"""The OpenAI Realtime protocol, sans-io: client frames in, server events out.

``RealtimeSession`` is one connection's state machine. It never touches a
socket; the web server owns the WebSocket and the pipeline streams, and calls
``receive`` / ``output`` / ``finish`` / ``encode``. See docs/protocol.md.
"""

from ._config import JSON_SUBPROTOCOL as JSON_SUBPROTOCOL
from ._config import MSGPACK_SUBPROTOCOL as MSGPACK_SUBPROTOCOL
from ._config import Dialect as Dialect
from ._config import Framing as Framing
from ._config import SessionConfig as SessionConfig
from ._config import select_subprotocol as select_subprotocol
from ._errors import ClientEventError as ClientEventError
from ._errors import LocalProtocolError as LocalProtocolError
from ._outputs import CancelResponse as CancelResponse
from ._outputs import Output as Output
from ._outputs import StartResponse as StartResponse
from ._outputs import StopPlayback as StopPlayback
from ._server_events import ServerEvent as ServerEvent
from ._server_events import new_id as new_id
from ._session import RealtimeSession as RealtimeSession
from ._session import SessionStatistics as SessionStatistics
from ._speculation import DropSpeculation as DropSpeculation
from ._speculation import Speculate as Speculate
from ._turns import SideStageAudio as SideStageAudio
from ._turns import TurnDetection as TurnDetection

__all__ = [
    "JSON_SUBPROTOCOL",
    "MSGPACK_SUBPROTOCOL",
    "CancelResponse",
    "ClientEventError",
    "Dialect",
    "DropSpeculation",
    "Framing",
    "LocalProtocolError",
    "Output",
    "RealtimeSession",
    "ServerEvent",
    "SessionConfig",
    "SessionStatistics",
    "SideStageAudio",
    "Speculate",
    "StartResponse",
    "StopPlayback",
    "TurnDetection",
    "new_id",
    "select_subprotocol",
]
