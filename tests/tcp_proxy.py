"""A TCP proxy in front of PostgreSQL that a test can cut and restore, like a database outage.

``cut("refuse")`` drops every open connection and refuses new ones (a stopped server);
``cut("blackhole")`` drops every open connection and accepts new ones that never get an answer
(a server or network that has gone silent); ``restore()`` forwards again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal
from urllib.parse import urlparse, urlunparse

Outage = Literal["refuse", "blackhole"]
_POLL_S = 0.05
_CHUNK = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode: Outage | None = None
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._mode_applied = threading.Condition(self._lock)
        self._applied = True
        self._stopped = threading.Event()
        self._listener: socket.socket | None = self._listen()
        self._acceptor = threading.Thread(target=self._accept_loop, name="proxy", daemon=True)
        self._acceptor.start()

    def proxied(self, url: str) -> str:
        """``url`` (postgresql://user@host:port/db) pointed at this proxy."""
        parsed = urlparse(url)
        user = parsed.netloc.rpartition("@")[0]
        address = f"127.0.0.1:{self.port}"
        return urlunparse(parsed._replace(netloc=f"{user}@{address}" if user else address))

    def cut(self, mode: Outage) -> None:
        self._switch(mode)
        self._drop_all()

    def restore(self) -> None:
        self._switch(None)
        self._drop_all()  # the black hole's silent connections fail now; clients reconnect

    def close(self) -> None:
        self._stopped.set()
        self._acceptor.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        self._drop_all()

    def _switch(self, mode: Outage | None) -> None:
        """Set the mode and wait until the acceptor has applied it (it alone owns the listener)."""
        with self._mode_applied:
            self.mode = mode
            self._applied = False
            while not self._applied:
                self._mode_applied.wait()

    def _listen(self) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(_POLL_S)
        self.port = listener.getsockname()[1]
        return listener

    def _apply_mode(self) -> None:
        with self._mode_applied:
            if self.mode == "refuse" and self._listener is not None:
                self._listener.close()
                self._listener = None
            elif self.mode != "refuse" and self._listener is None:
                self._listener = self._listen()
            self._applied = True
            self._mode_applied.notify_all()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            self._apply_mode()
            if self._listener is None:
                self._stopped.wait(_POLL_S)
                continue
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            self._track(client)
            if self.mode is None:
                threading.Thread(target=self._connect, args=(client,), daemon=True).start()
            # in the black hole the client stays connected, and nothing ever answers it

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self._drop(client)
            return
        upstream.settimeout(None)
        with self._lock:  # a cut since the accept drops both (cut sets the mode under this lock)
            forwarding = self.mode is None
            if forwarding:
                self._sockets.add(upstream)
        if not forwarding:
            self._drop(upstream)
            self._drop(client)
            return
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(_CHUNK):
                sink.sendall(data)
        self._drop(source)
        self._drop(sink)

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def _drop_all(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._drop(sock)


@contextmanager
def tcp_proxy(url: str) -> Iterator[TcpProxy]:
    """A proxy in front of the server of ``url``, closed afterwards."""
    parsed = urlparse(url)
    proxy = TcpProxy(parsed.hostname or "127.0.0.1", parsed.port or 5432)
    try:
        yield proxy
    finally:
        proxy.close()
