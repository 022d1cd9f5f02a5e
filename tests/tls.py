"""A test CA and the certificates it signs, made with ``cryptography`` (nothing leaves the test's
own directory): a server certificate for ``127.0.0.1`` and ``localhost``, or any names."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOCAL_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    serial: int


class TestCA:
    """A CA of its own in ``directory`` (``ca.pem``); :meth:`issue` signs server certificates."""

    __test__ = False  # not a test class, for pytest

    def __init__(self, directory: Path, name: str = "flexai test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._name = subject
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.path = directory / "ca.pem"
        self.path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, stem: str, names: tuple[str, ...] = LOCAL_NAMES, days: int = 30, client: bool = False
    ) -> Issued:
        """``stem.pem`` and ``stem.key`` (mode 0600): a server certificate for ``names`` (a
        client's, ``client``, named by the first)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alternative: list[x509.GeneralName] = []
        for name in names:
            try:
                alternative.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternative.append(x509.DNSName(name))
        serial = x509.random_serial_number()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )  # fmt: skip
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        cert_path = self.directory / f"{stem}.pem"
        key_path = self.directory / f"{stem}.key"
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.touch(mode=0o600)
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))  # fmt: skip
        return Issued(cert_path, key_path, serial)

    def client_context(self) -> ssl.SSLContext:
        """Trusts this CA only."""
        return ssl.create_default_context(cafile=str(self.path))


def served_serial(host: str, port: int, ca: TestCA) -> int:
    """The serial number of the certificate a new connection to ``host:port`` is shown."""
    import socket

    context = ca.client_context()
    with (socket.create_connection((host, port), timeout=10) as sock,
          context.wrap_socket(sock, server_hostname=host) as wrapped):  # fmt: skip
        der = wrapped.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number
