"""A listening TCP socket, bound before anything heavy loads (``omnitrio run``'s first step).

Standard library only: a taken port is reported before the web stack is imported
and long before any stage loads.
"""

from __future__ import annotations

import errno
import socket

BACKLOG = 100


class BindError(OSError):
    """The server could not listen on its address (taken, or not this machine's)."""


def listen_socket(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A socket listening on ``host:port``; ``BindError`` naming them if it cannot."""
    where = f"{host}:{port}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except (OSError, OverflowError) as exc:
        sock.close()
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            problem = "the address is already in use; pick another port with --port"
        else:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            problem = f"{reason}; check --host and --port"
        raise BindError(f"cannot listen on {where}: {problem}") from None
    return sock
