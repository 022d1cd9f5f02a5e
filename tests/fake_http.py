"""The tests' one fake HTTP server: a real threaded server on a free local port whose handler
reads each request's body and hands it to ``answer``. ``serve_json`` answers with a function's
JSON documents; the CLI's fake control plane (tests/unit/test_cli_http.py) and the artifact
protocol's (tests/artifact_plane.py) subclass :class:`FakeHandler`."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeHandler(BaseHTTPRequestHandler):
    """Hands GET, POST, PUT and DELETE with their body to ``answer``; logs nothing."""

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):  # each handshake in its connection's thread
            self.request.do_handshake()
        super().setup()

    def _answer(self) -> None:
        self.answer(self.command, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def answer(self, method: str, body: bytes) -> None:
        raise NotImplementedError

    def send(
        self, status: int, content_type: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def send_json(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
        self.send(status, "application/json", json.dumps(document).encode(), headers)

    def log_message(self, *args: object) -> None:
        pass


def serve(handler: type[FakeHandler], tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    """``handler`` on a free local port, started (``tls``: HTTPS with that server context).
    Call ``shutdown()``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)  # fmt: skip
        server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a refused peer
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def server_url(server: ThreadingHTTPServer) -> str:
    scheme = "https" if isinstance(server.socket, ssl.SSLSocket) else "http"
    return f"{scheme}://127.0.0.1:{server.server_address[1]}"


JsonHandler = Callable[[str, str, Message, bytes], tuple[Any, ...]]


def serve_json(handle: JsonHandler, tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    """A fake server where ``handle(method, path, headers, body)`` answers with a status and a
    JSON document, and optionally a dict of extra headers (``Retry-After``...)."""

    class Json(FakeHandler):
        def answer(self, method: str, body: bytes) -> None:
            status, document, *extra = handle(method, self.path, self.headers, body)
            self.send_json(status, document, extra[0] if extra else None)

    return serve(Json, tls)
