"""Where this node is reached: its address for its peers, and free ports for rendezvous."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"


def default_address(api_url: str) -> str:
    """The IP address of the interface that routes to the control plane (a UDP socket
    "connected" to it sends nothing, but the kernel picks that interface); 127.0.0.1 when
    there is none."""
    parts = urlsplit(api_url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        family, kind, proto, _, target = socket.getaddrinfo(
            parts.hostname or LOOPBACK, port, type=socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(target)
            return str(probe.getsockname()[0])
    except (OSError, ValueError, IndexError):
        return LOOPBACK


def free_port(address: str = LOOPBACK) -> int:
    """A TCP port free on ``address`` right now (bound to port 0, read, closed); on every
    interface when ``address`` is not one of this host's (behind a NAT, say)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            sock.bind(("", 0))
        return int(sock.getsockname()[1])
