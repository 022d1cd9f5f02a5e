"""Agents' client certificates (``flexai server --agent-client-ca FILE``): mutual TLS on top of
node tokens.

The TLS handshake asks every client for a certificate and checks one that is presented against
the agents' CA (a client that presents none, a browser or the CLI, still connects); the agent
routes then refuse a node token that came without one (:func:`api.http.deps.current_node`).

uvicorn hands an app no TLS peer, so the server's HTTP and WebSocket protocols are subclassed to
put it in each request's scope the way the ASGI TLS extension spells it
(``scope["extensions"]["tls"]["client_cert_chain"]`` and ``["client_cert_name"]``).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

AGENT_CA_FLAG = "--agent-client-ca"


def client_certificate(scope: Any) -> str | None:
    """The subject of the certificate the request's TLS client presented (verified against the
    agents' CA in the handshake), or None."""
    tls = (scope.get("extensions") or {}).get("tls") or {}
    if not tls.get("client_cert_chain"):
        return None
    return tls.get("client_cert_name") or "(a certificate without a subject)"


def protocols() -> tuple[type[asyncio.Protocol], type[asyncio.Protocol] | None]:
    """The HTTP and WebSocket protocols uvicorn would pick, made to pass the TLS peer on."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

    websocket = AutoWebSocketsProtocol
    return _passing_peer(AutoHTTPProtocol), (
        _passing_peer(websocket) if isinstance(websocket, type) else None
    )


def _passing_peer(protocol: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    def connection_made(self: Any, transport: asyncio.Transport, *args: Any) -> None:
        protocol.connection_made(self, transport, *args)  # type: ignore[call-arg]
        self.app = _with_tls(self.app, _tls_extension(transport))

    return type(f"PeerCertificate{protocol.__name__}", (protocol,),
                {"connection_made": connection_made})  # fmt: skip


def _tls_extension(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
    subject = (ssl_object.getpeercert() or {}).get("subject", ()) if der else ()
    name = ",".join(f"{key}={value}" for rdn in subject for key, value in rdn) or None
    return {"client_cert_chain": chain, "client_cert_name": name, "client_cert_error": None}


def _with_tls(app: Any, tls: dict[str, Any] | None) -> Any:
    if tls is None:
        return app

    async def app_with_tls(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["extensions"] = {**(scope.get("extensions") or {}), "tls": tls}
        await app(scope, receive, send)

    return app_with_tls
