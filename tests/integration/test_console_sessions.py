"""Signing in to the web console (each store): a server-side session in an HttpOnly,
SameSite=Strict cookie, opened with an API token and checked as the token is; sign-out and
revocation end it on every replica; forms need the page's CSRF token and its own origin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.identity.identities import Caller
from api.identity.sessions import SESSION_COOKIE
from tests.console import ORIGIN, Site, console_site


@pytest.fixture
def site(database_url: str, tmp_path: Path) -> Iterator[Site]:
    with console_site(database_url, tmp_path / "data") as opened:
        yield opened


def test_signing_in_sets_an_httponly_samesite_strict_cookie_that_holds_no_token(
    site: Site,
) -> None:
    alice = site.person("alice", signed_in=False)
    assert alice.client.get("/", follow_redirects=False).headers["location"] == "/sign-in?next=%2F"
    answer = alice.sign_in()
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and alice.token not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    page = alice.client.get("/")
    assert page.status_code == 200 and "Signed in as" in page.text and "alice" in page.text
    assert alice.token not in page.text


def test_over_https_the_session_cookie_is_secure(site: Site) -> None:
    issued = site.services.identities.create_user("carol", admin=False, by="admin")
    client = TestClient(site.app, base_url="https://testserver")
    answer = client.post("/sign-in", data={"token": issued.token},
                         headers={"Origin": "https://testserver"},
                         follow_redirects=False)  # fmt: skip
    assert answer.status_code == 303 and "Secure" in answer.headers["set-cookie"]


def test_an_unknown_revoked_or_node_token_does_not_sign_in_and_says_why(site: Site) -> None:
    alice = site.person("alice", signed_in=False)
    node = site.services.identities.issue_node_token("gpu-1", label="", by="admin").token
    revoked = site.services.identities.issue_user_token("alice", label="old", by="admin")
    site.services.identities.revoke(revoked.token_id, Caller("admin", "admin", admin=True))
    for token, says in (("flx_nope_nope", "not known"), (node, "node gpu-1"),
                        (revoked.token, "revoked")):  # fmt: skip
        answer = alice.sign_in(token)
        assert answer.status_code == 401 and says in answer.text, answer.text
        assert "set-cookie" not in answer.headers
    assert alice.client.get("/", follow_redirects=False).status_code == 303


def test_signing_out_ends_the_session_on_the_server_not_only_in_the_browser(
    site: Site,
) -> None:
    alice = site.person("alice")
    stolen = alice.client.cookies[SESSION_COOKIE]
    answer = alice.post("/sign-out", {"csrf": alice.csrf()})
    assert answer.status_code == 303 and answer.headers["location"] == "/sign-in"
    assert f'{SESSION_COOKIE}=""' in answer.headers["set-cookie"]
    replay = TestClient(site.app, cookies={SESSION_COOKIE: stolen})
    assert replay.get("/", follow_redirects=False).headers["location"].startswith("/sign-in")
    assert replay.get("/v1/jobs").status_code == 401


def test_revoking_the_token_ends_its_sessions_at_once(site: Site) -> None:
    alice = site.person("alice")
    assert alice.client.get("/").status_code == 200
    token_id = site.services.identities.tokens("alice")[0]["token_id"]
    assert alice.client.delete(f"/v1/tokens/{token_id}", headers=alice.bearer).status_code == 200
    assert alice.client.get("/", follow_redirects=False).status_code == 303
    assert alice.client.get("/live/jobs").status_code == 401


def test_a_session_opened_through_one_replica_is_known_by_another(
    site: Site, database_url: str, tmp_path: Path
) -> None:
    alice = site.person("alice")
    alice.submit("shared-job")
    with console_site(database_url, tmp_path / "data") as other:
        replica = TestClient(other.app, cookies=dict(alice.client.cookies))
        page = replica.get("/")
        assert page.status_code == 200 and "shared-job" in page.text
        alice.post("/sign-out", {"csrf": alice.csrf()})
        assert replica.get("/", follow_redirects=False).status_code == 303


def test_a_form_without_the_sessions_csrf_token_or_from_another_site_changes_nothing(
    site: Site,
) -> None:
    alice = site.person("alice")
    alice.submit("victim")
    csrf = alice.csrf("/jobs/victim")
    refused = [
        alice.post("/jobs/victim/stop", {}),
        alice.post("/jobs/victim/stop", {"csrf": "0" * 64}),
        alice.post("/jobs/victim/stop", {"csrf": csrf}, origin="https://evil.example"),
        alice.post("/jobs/victim/stop", {"csrf": csrf}, origin=None),
        alice.post("/jobs/victim/stop", {"csrf": csrf}, origin="null"),
    ]
    assert [answer.status_code for answer in refused] == [403] * 5
    assert "another site" in refused[2].text and "out of date" in refused[1].text
    bob = site.person("bob")
    assert bob.post("/jobs/victim/stop", {"csrf": csrf}).status_code == 403
    job = alice.client.get("/v1/jobs/victim", headers=alice.bearer).json()
    assert job["status"] == "pending" and [e["event"] for e in job["history"]] == ["Submitted"]


def test_a_stop_from_the_jobs_own_page_is_recorded_as_the_user_who_sent_it(site: Site) -> None:
    alice = site.person("alice")
    alice.submit("to-stop")
    answer = alice.post("/jobs/to-stop/stop", {"csrf": alice.csrf("/jobs/to-stop")},
                        Referer=f"{ORIGIN}/jobs/to-stop")  # fmt: skip
    assert answer.status_code == 303 and answer.headers["location"] == "/jobs/to-stop"
    job = alice.client.get("/v1/jobs/to-stop", headers=alice.bearer).json()
    assert job["status"] == "stopped"
    assert job["history"][1] == {**job["history"][1], "event": "StopRequested",
                                 "by": {"kind": "user", "id": "alice"}}  # fmt: skip


def test_signing_in_from_another_site_is_refused(site: Site) -> None:
    alice = site.person("alice", signed_in=False)
    answer = alice.client.post("/sign-in", data={"token": alice.token},
                               headers={"Origin": "https://evil.example"})  # fmt: skip
    assert answer.status_code == 403 and "set-cookie" not in answer.headers


def test_after_signing_in_the_browser_goes_back_to_its_page_of_this_site_only(
    site: Site,
) -> None:
    alice = site.person("alice", signed_in=False)
    for target, lands in (("/nodes", "/nodes"), ("https://evil.example/", "/"),
                          ("//evil.example/", "/")):  # fmt: skip
        answer = alice.client.post("/sign-in", data={"token": alice.token, "next": target},
                                   headers={"Origin": ORIGIN}, follow_redirects=False)  # fmt: skip
        assert answer.headers["location"] == lands


def test_the_cookie_reads_the_api_for_its_download_links_but_never_writes(site: Site) -> None:
    alice = site.person("alice")
    alice.submit("reader")
    assert alice.client.get("/v1/jobs/reader/logs").status_code == 200
    assert alice.client.get("/v1/jobs/reader").json()["name"] == "reader"
    assert alice.client.post("/v1/jobs/reader/stop", headers={"Origin": ORIGIN}
                             ).status_code == 401  # fmt: skip
    assert alice.client.delete("/v1/jobs/reader").status_code == 401
    job = alice.client.get("/v1/jobs/reader", headers=alice.bearer).json()
    assert job["status"] == "pending"
