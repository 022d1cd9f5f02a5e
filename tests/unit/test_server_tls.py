"""`flexai server --tls-cert/--tls-key`: files that cannot serve are one error line before
anything starts; a reload takes a whole new certificate and key or keeps the old ones; HSTS on
what is answered over https; the URL clients on this host are given."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from api.http.strict_transport import StrictTransport
from api.server import main
from api.tls import (
    Certificate,
    ServerTls,
    TlsError,
    plain_http_warning,
    public_host,
)
from tests.tls import TestCA


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "ca")


def test_a_whole_certificate_and_key_are_described(ca: TestCA) -> None:
    issued = ca.issue("server", ("cp.internal", "127.0.0.1"), days=10)
    certificate = ServerTls(issued.cert, issued.key).check()
    assert certificate.names == ("cp.internal", "127.0.0.1")
    assert str(certificate).startswith("for cp.internal, 127.0.0.1, valid until 20")


def test_a_key_in_the_certificates_file_serves_too(ca: TestCA, tmp_path: Path) -> None:
    issued = ca.issue("server")
    both = tmp_path / "both.pem"
    both.write_bytes(issued.cert.read_bytes() + issued.key.read_bytes())
    both.chmod(0o600)
    assert ServerTls(both).check().names == ("127.0.0.1", "localhost")


@pytest.mark.parametrize("broken", ["missing", "other key", "key as cert", "garbage"])
def test_files_that_cannot_serve_are_refused_naming_them(
    ca: TestCA, tmp_path: Path, broken: str
) -> None:
    issued, other = ca.issue("server"), ca.issue("other")
    cert, key = issued.cert, issued.key
    if broken == "missing":
        key = tmp_path / "absent.key"
    elif broken == "other key":
        key = other.key
    elif broken == "key as cert":
        cert = issued.key
    else:
        (tmp_path / "garbage.pem").write_text("not a certificate\n")
        cert = tmp_path / "garbage.pem"
    with pytest.raises(TlsError) as refused:
        ServerTls(cert, key).check()
    message = str(refused.value)
    assert str(key if broken == "missing" else cert) in message
    if broken != "missing":
        assert "--tls-cert" in message


def test_a_reload_takes_the_new_pair_or_keeps_serving_the_old(ca: TestCA, tmp_path: Path) -> None:
    first, second = ca.issue("first"), ca.issue("second")
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "cert.pem", live / "key.pem"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls = ServerTls(cert, key)

    cert.write_bytes(second.cert.read_bytes())  # a renewal caught half-way: the old key
    with pytest.raises(TlsError):
        tls.reload(context)
    assert _served_serial(context, ca) == first.serial

    key.write_bytes(second.key.read_bytes())
    tls.reload(context)
    assert _served_serial(context, ca) == second.serial


def _served_serial(server: ssl.SSLContext, ca: TestCA) -> int:
    """The serial of the certificate a handshake with ``server`` shows (in memory)."""
    from cryptography import x509

    client = ca.client_context()
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    client_side = client.wrap_bio(client_in, client_out, server_hostname="127.0.0.1")
    for _ in range(10):
        for side in (client_side, server_side):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    der = client_side.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.parametrize(
    ("host", "names", "expected"),
    [("127.0.0.1", None, "127.0.0.1"), ("0.0.0.0", None, "127.0.0.1"),
     ("0.0.0.0", ("cp.internal", "localhost"), "localhost"),
     ("0.0.0.0", ("*.fleet.example", "cp.fleet.example"), "cp.fleet.example"),
     ("10.1.2.3", ("cp.internal", "10.1.2.3"), "10.1.2.3"),
     ("10.1.2.3", ("cp.internal",), "cp.internal")],
)  # fmt: skip
def test_the_url_clients_here_are_given_names_what_the_certificate_holds(
    host: str, names: tuple[str, ...] | None, expected: str
) -> None:
    certificate = Certificate(names, "2027-01-01 00:00 UTC") if names else None
    assert public_host(host, certificate) == expected


def test_listening_beyond_loopback_without_tls_is_warned_of() -> None:
    assert plain_http_warning("127.0.0.1", proxied=False) is None
    assert plain_http_warning("localhost", proxied=False) is None
    warning = plain_http_warning("0.0.0.0", proxied=False)
    assert warning is not None and warning.startswith("warning: listening on 0.0.0.0 without TLS")
    assert "--tls-cert FILE --tls-key FILE" in warning
    assert "--forwarded-allow-ips" in (plain_http_warning("0.0.0.0", proxied=True) or "")


def test_hsts_is_sent_over_https_only() -> None:
    app = StrictTransport(Starlette(routes=[Route("/", lambda _: PlainTextResponse("hi"))]))
    over_https = TestClient(app, base_url="https://testserver").get("/")
    assert over_https.headers["strict-transport-security"] == "max-age=31536000"
    over_http = TestClient(app, base_url="http://testserver").get("/")
    assert "strict-transport-security" not in over_http.headers


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--tls-key", "k.pem"], "error: --tls-key needs --tls-cert"),
     (["--agent-client-ca", "ca.pem"], "error: --agent-client-ca needs --tls-cert"),
     (["--tls-cert", "absent.pem", "--tls-key", "absent.key"], "error: cannot read absent.pem")],
)  # fmt: skip
def test_tls_flags_that_cannot_serve_stop_the_server_before_it_opens_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    flags: list[str], said: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["--data-dir", str(tmp_path / "data"), "--no-client-config", *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith(said) and error.count("\n") == 1
    assert not (tmp_path / "data").exists()


def test_an_agents_ca_that_is_no_certificate_is_refused_naming_it(
    ca: TestCA, tmp_path: Path
) -> None:
    issued = ca.issue("server")
    (tmp_path / "agents.pem").write_text("not a CA\n")
    with pytest.raises(TlsError, match="as the agents' CA") as refused:
        ServerTls(issued.cert, issued.key, tmp_path / "agents.pem").check()
    assert "--agent-client-ca" in str(refused.value)
    assert ServerTls(issued.cert, issued.key, ca.path).check().names == ("127.0.0.1", "localhost")
