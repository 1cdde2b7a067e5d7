"""The Realtime API over WebRTC: aiortc's peer connections beside the trio server.

aiortc (asyncio) runs on a thread of its own (``AsyncioThread``); each call is one
``CallLink``: the ``oai-events`` data channel as a message transport, the caller's
microphone track in, the answer's audio track out (``Playout``, bounded). The server's
``POST /v1/realtime/calls`` (omnitrio/server/_calls.py) drives them. Importing this
package needs the ``webrtc`` extra (aiortc).
"""

from ._bridge import AsyncioThread as AsyncioThread
from ._bridge import BridgeClosed as BridgeClosed
from ._link import CallLink as CallLink
from ._peer import EVENTS_LABEL as EVENTS_LABEL
from ._peer import PeerGone as PeerGone
from ._peer import use_host_addresses as use_host_addresses
from ._playout import TRACK_RATE_HZ as TRACK_RATE_HZ
from ._playout import Playout as Playout

__all__ = [
    "EVENTS_LABEL",
    "TRACK_RATE_HZ",
    "AsyncioThread",
    "BridgeClosed",
    "CallLink",
    "PeerGone",
    "Playout",
    "use_host_addresses",
]
