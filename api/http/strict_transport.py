"""HSTS (RFC 6797) on every answer given over https: the server's own TLS, or a TLS proxy's
whose ``X-Forwarded-Proto`` ``--forwarded-allow-ips`` believes. Browsers then refuse the console
over plain http for a year."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

HSTS = b"max-age=31536000"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class StrictTransport:
    """Adds ``Strict-Transport-Security`` to every answer given over https."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_with_hsts(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"strict-transport-security", HSTS)]  # fmt: skip
            await send(message)

        await self.app(scope, receive, send_with_hsts)
