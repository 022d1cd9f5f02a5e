"""An httpx transport on the standard library's ``http.client``, for the bulk bytes of downloads.

httpx reads a body 64 KiB at a time through h11, copying each piece several times in Python:
a download hashed and written took 2.3 to 2.6 CPU seconds per GiB that way, 1.2 to 1.5 this way
(the SHA-256 alone is 0.6) on the machine of ``bench/artifacts.py``. An ``http.client``
response reads straight into a buffer the caller owns (``response.extensions[READINTO]``): one
copy, from the kernel. Requests are still httpx's (headers, timeouts, the control plane's
event hooks), and answers are ``httpx.Response`` objects, so the code around them is the same;
failures are raised as httpx's ``TransportError`` kinds.

It asks for the bytes as they are (``Accept-Encoding: identity``), verifies TLS as httpx does
by default (``httpx.create_ssl_context``: certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), and
speaks to no proxy: :func:`proxied` tells when a URL must go through httpx's own transport.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing

import httpx

READ = 2**20
"""Bytes per piece when the body is iterated rather than read into a buffer."""
KEEP = 4
"""Idle connections kept per origin, for the next request."""
READINTO = "readinto"
"""The extension of a direct answer (httpx wraps its stream): its :meth:`DirectStream.readinto`."""


def proxied(url: httpx.URL) -> bool:
    """Whether the environment sends ``url`` through a proxy (then httpx's transport goes)."""
    proxies = urllib.request.getproxies_environment()
    if not any(key in proxies for key in (url.scheme, "all")):
        return False
    return not urllib.request.proxy_bypass(url.host)


class DownloadClients:
    """The clients of one download: ``api`` (the control plane's, with its token and event
    hooks) whose requests go out through the direct transport where it would have used
    httpx's own, and a client for the store's URLs (no token), made on first use."""

    def __init__(self, api: httpx.Client, tls: ssl.SSLContext | None = None) -> None:
        self.api = api
        self.tls = tls
        """How https is verified (None: httpx's default context)."""
        self._direct: httpx.Client | None = None
        self._proxied: httpx.Client | None = None

    def control(self, path: str, headers: dict[str, str]) -> AbstractContextManager[httpx.Response]:
        """``GET path`` of the control plane, streamed."""
        request = self.api.build_request("GET", path, headers=headers)
        plain = isinstance(getattr(self.api, "_transport", None), httpx.HTTPTransport)
        if not plain or proxied(request.url):  # a test's transport, or a proxy: as it was
            return self.api.stream("GET", path, headers=headers)
        for hook in self.api.event_hooks["request"]:
            hook(request)
        return closing(self.direct().send(request, stream=True))

    def store(self, url: str) -> httpx.Client:
        """The client for ``url`` of the store (where the control plane redirected)."""
        if not proxied(httpx.URL(url)):
            return self.direct()
        if self._proxied is None:
            self._proxied = httpx.Client(timeout=self.api.timeout, follow_redirects=False,
                                         verify=self.tls if self.tls is not None else True)
        return self._proxied

    def direct(self) -> httpx.Client:
        if self._direct is None:  # no CA bundle is loaded before a TLS connection needs it
            self._direct = httpx.Client(timeout=self.api.timeout, follow_redirects=False,
                                        transport=DirectTransport(self.tls))  # fmt: skip
        return self._direct

    def close(self) -> None:
        for client in (self._direct, self._proxied):
            if client is not None:
                client.close()


class DirectTransport(httpx.BaseTransport):
    """Sends each request on an ``http.client`` connection (a few kept per origin for the next)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = tls

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeouts = request.extensions.get("timeout", {})
        headers = {key: value for key, value in request.headers.items()
                   if key.lower() not in ("accept-encoding", "connection")}  # fmt: skip
        headers["Accept-Encoding"] = "identity"
        with self._lock:
            kept = self._idle.get(origin)
            connection = kept.pop() if kept else None
        while True:
            reused = connection is not None
            if connection is None:
                connection = self._connect(origin, timeouts.get("connect"))
                try:
                    connection.connect()  # within the connect timeout
                except Exception as error:
                    connection.close()
                    raise _as_httpx(error, request, connecting=True) from error
            try:
                connection.sock.settimeout(timeouts.get("read"))
                connection.request(request.method, url.raw_path.decode("ascii"),
                                   body=request.read() or None, headers=headers)  # fmt: skip
                answer = connection.getresponse()
                break
            except Exception as error:
                connection.close()
                connection = None
                if not (reused and isinstance(error, (OSError, http.client.HTTPException))):
                    raise _as_httpx(error, request) from error
                # a kept connection the server closed meanwhile: once more, on a new one
        stream = DirectStream(answer, request, lambda: self._keep(origin, connection))
        return httpx.Response(
            answer.status, headers=answer.getheaders(), request=request, stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": answer.reason.encode(),
                        READINTO: stream.readinto},
        )  # fmt: skip

    def _connect(self, origin: tuple[str, str, int],
                 timeout: float | None) -> http.client.HTTPConnection:  # fmt: skip
        scheme, host, port = origin
        if scheme == "https":
            if self._tls is None:
                self._tls = httpx.create_ssl_context()
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _keep(self, origin: tuple[str, str, int], connection: http.client.HTTPConnection) -> None:
        with self._lock:
            kept = self._idle.setdefault(origin, [])
            if len(kept) < KEEP:
                kept.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = [c for kept in self._idle.values() for c in kept], {}
        for connection in idle:
            connection.close()


class DirectStream(httpx.SyncByteStream):
    """A response's body, read into the caller's buffer or iterated; its connection is kept
    for the next request only once the body was read to its end."""

    def __init__(self, answer: http.client.HTTPResponse, request: httpx.Request,
                 keep: Callable[[], None]) -> None:  # fmt: skip
        self._answer = answer
        self._request = request
        self._keep = keep

    def readinto(self, buffer: memoryview) -> int:
        """Fill ``buffer`` as far as the body goes; 0 at its end (or at a cut: the caller
        counts the bytes)."""
        filled = 0
        try:
            while filled < len(buffer):
                got = self._answer.readinto(buffer[filled:])
                if not got:
                    break
                filled += got
        except Exception as error:
            raise _as_httpx(error, self._request) from error
        return filled

    def __iter__(self) -> Iterator[bytes]:
        try:
            while piece := self._answer.read(READ):
                yield piece
        except Exception as error:
            raise _as_httpx(error, self._request) from error

    def close(self) -> None:
        if self._answer.length == 0:
            self._answer.read()  # an empty body (a redirect) is read to its end at once
        whole = (self._answer.isclosed() and not self._answer.will_close
                 and not self._answer.length)  # fmt: skip
        self._answer.close()
        if whole:
            self._keep()


def _as_httpx(error: Exception, request: httpx.Request, *,
              connecting: bool = False) -> Exception:  # fmt: skip
    """The httpx exception that stands for ``error`` (others pass as they are)."""
    if isinstance(error, (socket.timeout, TimeoutError)):
        timeout = httpx.ConnectTimeout if connecting else httpx.ReadTimeout
        return timeout(str(error) or "timed out", request=request)
    if connecting and isinstance(error, OSError):
        return httpx.ConnectError(str(error), request=request)
    if isinstance(error, http.client.HTTPException):
        return httpx.RemoteProtocolError(str(error) or type(error).__name__, request=request)
    if isinstance(error, OSError):
        return httpx.ReadError(str(error), request=request)
    return error
