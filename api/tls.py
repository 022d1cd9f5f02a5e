"""HTTPS for `flexai server`: its certificate and key (``--tls-cert``, ``--tls-key``), checked at
start with a clear error, reloaded on ``SIGHUP`` without dropping a connection (HSTS:
``api.http.strict_transport``).

A reload reads both files once, checks that they make a whole certificate chain and key on a
scratch context, and only then loads those same bytes into the listening context: a renewal
caught half-written keeps the certificate in service, and new connections get the new one while
open ones (log follows, agents' long polls, debug sessions) go on with theirs.
"""

from __future__ import annotations

import os
import ssl
import stat
import tempfile
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

from common.tls import is_loopback


class TlsError(Exception):
    """A certificate or key that cannot serve; the message says which file and why."""


@dataclass(frozen=True)
class Certificate:
    """What a loaded certificate says, for the start-up line and the logs."""

    names: tuple[str, ...]
    """Its subject alternative names (DNS names and IP addresses), else its common name."""
    not_after: str

    def __str__(self) -> str:
        return f"for {', '.join(self.names) or '(no name)'}, valid until {self.not_after}"


@dataclass(frozen=True)
class ServerTls:
    cert_file: Path
    key_file: Path | None = None
    """None: the key is in ``cert_file`` too."""
    client_ca: Path | None = None
    """The CA that signs agents' client certificates (``--agent-client-ca``), if required."""

    def check(self) -> Certificate:
        """The files make a certificate chain and its key (TlsError otherwise)."""
        cert, key = self._read()
        with _written(cert, key) as (cert_path, key_path):
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert_path, key_path, self)
        if self.client_ca is not None:
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(self.client_ca)
            except (OSError, ssl.SSLError) as error:
                reason = getattr(error, "strerror", None) or getattr(error, "reason", None)
                raise TlsError(
                    f"cannot use {self.client_ca} as the agents' CA ({reason or error}): give "
                    "the PEM certificate of the CA that signs their client certificates with "
                    "--agent-client-ca"
                ) from None
        return describe(cert, self.cert_file)

    def reload(self, context: ssl.SSLContext) -> Certificate:
        """Serve the files' certificate and key on ``context`` from now on, once they have
        proved whole; TlsError (the old ones still served) otherwise."""
        cert, key = self._read()
        with _written(cert, key) as (cert_path, key_path):
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert_path, key_path, self)
            context.load_cert_chain(cert_path, key_path)
        return describe(cert, self.cert_file)

    def loose_key_warning(self) -> str | None:
        """A warning when other users can read the private key's file."""
        path = self.key_file or self.cert_file
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            return (f"other users can read the TLS key {path} (mode {mode:04o}): chmod 600 "
                    f"{path}")  # fmt: skip
        return None

    def _read(self) -> tuple[bytes, bytes | None]:
        files = [self.cert_file] + ([self.key_file] if self.key_file else [])
        read: list[bytes] = []
        for path in files:
            try:
                read.append(path.read_bytes())
            except OSError as error:
                raise TlsError(f"cannot read {path}: {error.strerror or error}") from None
        return read[0], read[1] if len(read) > 1 else None


def _load(context: ssl.SSLContext, cert: str, key: str | None, tls: ServerTls) -> None:
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as error:
        key_name = tls.key_file or tls.cert_file
        raise TlsError(
            f"{tls.cert_file} and {key_name} do not make a certificate and its private key "
            f"({error.reason or error}): give the PEM certificate (chain) with --tls-cert and "
            "its unencrypted PEM key with --tls-key"
        ) from None


class _written:
    """Both files' bytes in a private temporary directory, so that the check and the load
    read the same bytes however the files change meanwhile."""

    def __init__(self, cert: bytes, key: bytes | None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="flexai-tls-")
        self._files = (cert, key)

    def __enter__(self) -> tuple[str, str | None]:
        root = Path(self._dir.name)
        paths: list[str | None] = []
        for name, data in zip(("cert.pem", "key.pem"), self._files, strict=True):
            if data is None:
                paths.append(None)
                continue
            fd = os.open(root / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            paths.append(str(root / name))
        assert paths[0] is not None
        return paths[0], paths[1]

    def __exit__(self, *_: object) -> None:
        self._dir.cleanup()


def describe(pem: bytes, path: Path) -> Certificate:
    """The names and expiry of the first certificate of ``pem``."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise TlsError(f"{path} holds no PEM certificate: give it with --tls-cert") from None
    try:
        alternative = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(name.value) for name in alternative
                 if isinstance(name, x509.DNSName | x509.IPAddress)]  # fmt: skip
    except x509.ExtensionNotFound:
        names = [str(n.value) for n in cert.subject.get_attributes_for_oid(x509.OID_COMMON_NAME)]
    expires = cert.not_valid_after_utc.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Certificate(tuple(names), expires)


def public_host(host: str, certificate: Certificate | None) -> str:
    """The host name clients on this host reach the server by: its listening address, else
    (``0.0.0.0``) loopback; over TLS, a name its certificate holds (the address first)."""
    wildcard = host in ("0.0.0.0", "::", "")
    listening = "127.0.0.1" if wildcard else host
    if certificate is None or listening in certificate.names:
        return listening
    if wildcard:
        local = [name for name in certificate.names if is_loopback(name)]
        if local:
            return local[0]
    named = [name for name in certificate.names if "*" not in name]
    return named[0] if named else listening


def plain_http_warning(host: str, proxied: bool) -> str | None:
    """A warning for a server listening on another address than loopback without TLS."""
    if is_loopback(host):
        return None
    behind = (" (the hop from the TLS proxy that --forwarded-allow-ips trusts included)"
              if proxied else "")  # fmt: skip
    return (f"warning: listening on {host or '*'} without TLS: API tokens, secrets and logs "
            f"cross the network in clear text{behind}; pass --tls-cert FILE --tls-key FILE, or "
            "listen on 127.0.0.1 behind a TLS proxy")  # fmt: skip
