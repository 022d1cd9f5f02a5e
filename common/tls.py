"""How the CLI and the agent reach a control plane: over TLS, verified against the system's CAs
and a private CA where one is given (``FLEXAI_CA_FILE``, the client config's ``ca_file``,
``--ca-file``); over plain ``http://`` only to this host's own loopback, unless the user allows it
(``--allow-http``, ``FLEXAI_ALLOW_HTTP=1``), and then with a warning. A token is never sent in
clear text to another host: the check is made before any connection is.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import sys
from functools import cache
from urllib.parse import urlsplit

ALLOW_HTTP = "FLEXAI_ALLOW_HTTP"
CA_FILE = "FLEXAI_CA_FILE"


class TlsConfigError(Exception):
    """How the server is to be reached cannot be made safe; the message says what to do."""


class PlainHttpRefused(TlsConfigError):
    """An ``http://`` URL of another host, not allowed."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this host's own loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_http() -> bool:
    return os.environ.get(ALLOW_HTTP, "").strip().lower() in ("1", "true", "yes")


_WARNED: set[str] = set()


def check_url(url: str, allow_http: bool | None = None, who: str = "flexai") -> None:
    """Refuse an ``http://`` URL of another host unless allowed; warn (once) where allowed."""
    parts = urlsplit(url)
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return
    allowed = allowed_http() if allow_http is None else allow_http
    origin = f"{parts.scheme}://{parts.netloc}"
    if not allowed:
        raise PlainHttpRefused(
            f"{origin} is plain HTTP to another host: your API token would cross the network "
            "in clear text. Use the server's https:// URL (flexai server --tls-cert FILE "
            "--tls-key FILE, or a TLS proxy in front of it); to send it anyway, pass "
            f"--allow-http (or set {ALLOW_HTTP}=1)"
        )
    if origin not in _WARNED:
        _WARNED.add(origin)
        print(f"{who}: warning: {origin} is plain HTTP: the token crosses the network in clear "
              "text", file=sys.stderr)  # fmt: skip


@cache
def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """Verifies servers against the system's CAs and ``ca_file`` (a private CA's certificate,
    or the server's own: a certificate in it is trusted even if it is not a CA's); presents
    ``cert_file`` (with ``key_file``, else the key in it) to a server that asks for a client
    certificate (an agent's, where the control plane requires mutual TLS)."""
    context = ssl.create_default_context()
    if cert_file:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as error:
            reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
            raise TlsConfigError(
                f"cannot use {cert_file} and {key_file or cert_file} as the client certificate "
                f"and its key ({reason}): give the PEM certificate with --client-cert and its "
                "unencrypted PEM key with --client-key"
            ) from None
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as error:
            reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
            raise TlsConfigError(
                f"cannot use {ca_file} as the CA to trust ({reason}): give a PEM file with the "
                f"certificate of the CA that signed the server's (or the server's own), with "
                f"--ca-file or {CA_FILE}"
            ) from None
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def ca_file(configured: str | None = None) -> str | None:
    """The private CA to trust: ``FLEXAI_CA_FILE``, else the configured one (the client config,
    ``--ca-file``)."""
    return os.environ.get(CA_FILE) or configured or None


def describe_failure(error: BaseException, url: str, ca: str | None) -> str | None:
    """A certificate that did not verify, said with the host and what to pass; None when
    ``error`` is no such failure."""
    seen = error
    while seen is not None and not isinstance(seen, ssl.SSLCertVerificationError):
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    if seen is None:
        if "CERTIFICATE_VERIFY_FAILED" not in str(error):
            return None
        reason = "certificate verify failed"
    else:
        reason = seen.verify_message or str(seen)
    host = urlsplit(url).netloc
    trusted = f"the CA in {ca} and the system's" if ca else "the system's CAs"
    return (f"the TLS certificate of {host} did not verify against {trusted} ({reason}); no "
            f"token was sent. If it is signed by a private CA, pass its certificate with "
            f"--ca-file FILE (or set {CA_FILE}); check the URL's host name too")
