"""TLS on the client side (the CLI, the agent): a certificate that does not verify is a clear
error and no token leaves; plain http:// goes to this host's loopback only, refused before any
connection is made to another host (nothing is sent to one: these machines reach loopback
only); a private CA is trusted where it is given."""

from __future__ import annotations

import json
import os
import pwd
import socket
import ssl
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from cli.main import main as flexai
from common import tls
from node_agent.client import ApiUnavailable, ControlPlaneClient
from node_agent.main import main as agent_main
from tests.fake_http import serve_json, server_url
from tests.tls import TestCA

ME = pwd.getpwuid(os.geteuid()).pw_name
"""Jobs run as the tests' own user (checked before the server's URL)."""
ELSEWHERE = "http://cp.internal:8000"


@pytest.fixture
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


class Seen:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []


@pytest.fixture
def https_plane(ca: TestCA) -> Iterator[tuple[Seen, str]]:
    """A JSON server over HTTPS with a certificate of ``ca`` for 127.0.0.1; what reached it."""
    issued = ca.issue("server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert, issued.key)
    seen = Seen()

    def answer(method: str, path: str, headers: Message, body: bytes) -> tuple[int, Any]:
        seen.requests.append((method, path, headers.get("Authorization")))
        return 200, {"jobs": [], "count": 0, "next_cursor": None}

    server = serve_json(answer, tls=context)
    yield seen, server_url(server)
    server.shutdown()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every name lookup and connection is recorded and fails: nothing can leave this host."""
    tried: list[object] = []

    def refuse_lookup(host: object, *args: object, **kwargs: object) -> Any:
        tried.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "no lookups in this test")

    def refuse_connect(self: socket.socket, address: object) -> None:
        tried.append(address)
        raise OSError("no connections in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    return tried


@pytest.fixture(autouse=True)
def fresh_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXAI_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("FLEXAI_TOKEN", "secret-token")
    for name in (tls.CA_FILE, tls.ALLOW_HTTP, "FLEXAI_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tls, "_WARNED", set())


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://127.9.9.9", "http://localhost:1",
            "http://[::1]:8000", "http://api.localhost", "https://cp.internal"],
)  # fmt: skip
def test_loopback_and_https_urls_pass_the_check(url: str) -> None:
    tls.check_url(url, allow_http=False)


def test_the_cli_refuses_plain_http_to_another_host_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_network: list[object]
) -> None:
    monkeypatch.setenv("FLEXAI_API_URL", ELSEWHERE)
    assert flexai(["training", "list"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: http://cp.internal:8000 is plain HTTP to another host")
    assert "--allow-http" in error and "FLEXAI_ALLOW_HTTP=1" in error and "https://" in error
    assert no_network == []  # not even a name lookup


@pytest.mark.parametrize("allow", [["--allow-http"], []])
def test_allowed_plain_http_warns_once_per_command(
    allow: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    no_network: list[object],
) -> None:  # fmt: skip
    monkeypatch.setenv("FLEXAI_API_URL", ELSEWHERE)
    if not allow:
        monkeypatch.setenv(tls.ALLOW_HTTP, "1")
    assert flexai([*allow, "training", "list"]) == 1  # no host answers in this test
    error = capsys.readouterr().err
    warning = "warning: http://cp.internal:8000 is plain HTTP: the token crosses the network"
    assert error.count(warning) == 1
    assert "cannot reach the control plane at http://cp.internal:8000" in error
    assert no_network  # it tried, as it was allowed to


def test_a_certificate_that_does_not_verify_is_named_and_no_token_is_sent(
    https_plane: tuple[Seen, str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    seen, url = https_plane
    monkeypatch.setenv("FLEXAI_API_URL", url)
    assert flexai(["training", "list"]) == 1
    error = capsys.readouterr().err
    host = url.removeprefix("https://")
    assert error.startswith(f"error: the TLS certificate of {host} did not verify against the "
                            "system's CAs (unable to get local issuer certificate); no token "
                            "was sent")  # fmt: skip
    assert "--ca-file FILE" in error and "FLEXAI_CA_FILE" in error
    assert error.count("\n") == 1
    assert seen.requests == []


def test_a_private_ca_is_trusted_from_the_environment_or_the_config(
    https_plane: tuple[Seen, str], ca: TestCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    seen, url = https_plane
    monkeypatch.setenv("FLEXAI_API_URL", url)
    monkeypatch.setenv(tls.CA_FILE, str(ca.path))
    assert flexai(["training", "list"]) == 0
    monkeypatch.delenv(tls.CA_FILE)
    monkeypatch.delenv("FLEXAI_API_URL")
    monkeypatch.delenv("FLEXAI_TOKEN")
    config = {"api_url": url, "token": "kept-token", "ca_file": str(ca.path)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert flexai(["training", "list"]) == 0
    tokens = [token for _, _, token in seen.requests]
    assert tokens == ["Bearer secret-token", "Bearer kept-token"]


def test_a_ca_file_that_is_no_certificate_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    no_network: list[object],
) -> None:  # fmt: skip
    (tmp_path / "not-a-ca.pem").write_text("hello\n")
    monkeypatch.setenv("FLEXAI_API_URL", "https://cp.internal:8000")
    monkeypatch.setenv(tls.CA_FILE, str(tmp_path / "not-a-ca.pem"))
    assert flexai(["training", "list"]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"error: cannot use {tmp_path / 'not-a-ca.pem'} as the CA to trust")
    assert "PEM" in error
    assert no_network == []


def test_the_agent_refuses_plain_http_to_another_host_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_network: list[object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("FLEXAI_TOKEN")  # else the agent starts again without it (execve)
    token = tmp_path / "node.token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    argv = ["--server", ELSEWHERE, "--token-file", str(token), "--accels", "1",
            "--work-dir", str(tmp_path / "agent"), "--no-sandbox", "--job-user", ME]  # fmt: skip
    assert agent_main(argv) == 1
    error = capsys.readouterr().err
    assert error.startswith("flexai agent: error: http://cp.internal:8000 is plain HTTP to "
                            "another host")  # fmt: skip
    assert no_network == []


def test_the_agent_warns_when_allowed_plain_http(
    capsys: pytest.CaptureFixture[str], no_network: list[object]
) -> None:
    ControlPlaneClient(ELSEWHERE, "t0ken", allow_http=True).close()
    assert capsys.readouterr().err == (
        "flexai agent: warning: http://cp.internal:8000 is plain HTTP: the token crosses the "
        "network in clear text\n"
    )
    assert no_network == []


def test_the_agent_verifies_the_control_plane_with_its_ca_file(
    https_plane: tuple[Seen, str], ca: TestCA
) -> None:
    seen, url = https_plane
    untrusting = ControlPlaneClient(url, "t0ken", retry_for=0.3)
    with pytest.raises(ApiUnavailable, match="did not verify against the system's CAs"):
        untrusting.assignments("node-1")
    untrusting.close()
    assert seen.requests == []
    trusting = ControlPlaneClient(url, "t0ken", ca_file=str(ca.path))
    trusting._json("GET", "/v1/nodes/node-1/assignments")
    trusting.close()
    assert seen.requests == [("GET", "/v1/nodes/node-1/assignments", "Bearer t0ken")]


def test_an_agents_client_certificate_that_cannot_serve_is_a_clear_error(
    ca: TestCA, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_network: list[object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("FLEXAI_TOKEN")  # else the agent starts again without it (execve)
    issued, other = ca.issue("agent", ("node-1",), client=True), ca.issue("other", client=True)
    with pytest.raises(tls.TlsConfigError, match="as the client certificate and its key"):
        ControlPlaneClient("https://cp.internal:8000", "t0ken",
                           client_certificate=(str(issued.cert), str(other.key)))  # fmt: skip
    ControlPlaneClient("https://cp.internal:8000", "t0ken",
                       client_certificate=(str(issued.cert), str(issued.key))).close()  # fmt: skip
    token = tmp_path / "node.token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    argv = ["--server", "https://cp.internal:8000", "--token-file", str(token), "--accels", "1",
            "--work-dir", str(tmp_path / "agent"), "--no-sandbox", "--job-user", ME,
            "--client-key", "k.pem"]  # fmt: skip
    assert agent_main(argv) == 1
    assert "--client-key needs --client-cert" in capsys.readouterr().err
    assert no_network == []
