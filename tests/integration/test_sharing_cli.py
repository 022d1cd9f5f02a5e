"""The `flexai` commands of a shared fleet against the real server application (each store):
`admin user quota` and `admin user high-priority` set what `admin user list` then shows, and
`training run --priority high` is refused until an admin allows it, then `inspect` shows it.
Only the transport is swapped: the CLI's client talks to the app in-process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.identity.identities import ensure_admin_token
from api.services import build_services
from api.settings import Settings
from cli.client.api import ApiClient
from cli.main import main

Use = Callable[[str], None]
"""Make the CLI act with the token of ``admin`` or ``alice``."""


@pytest.fixture
def use(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Use]:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    services = build_services(settings)
    tokens = {"admin": ensure_admin_token(services.identities, settings.data_dir)[0],
              "alice": services.identities.create_user("alice", admin=False, by="admin").token}
    app = create_app(services, background=False)
    with TestClient(app):  # the app started, as the server starts it

        def as_caller(who: str) -> None:
            def from_config(cls: type[ApiClient], owner: str | None = None) -> ApiClient:
                client = ApiClient("http://localhost", tokens[who], owner=owner)
                client._http = TestClient(app, headers={"Authorization": f"Bearer {tokens[who]}"})
                return client

            monkeypatch.setattr(ApiClient, "from_config", classmethod(from_config))

        yield as_caller
    services.close()


def run_high(name: str, repo: Path) -> int:
    (repo / ".git").mkdir(exist_ok=True)  # the CLI checks that -u is a git checkout's root
    return main(["training", "run", name, "-u", str(repo), "--priority", "high",
                 "--max-retries", "2", "--retry-on-exit-codes", "137,143", "--", "train.py"])


def test_an_admin_sets_a_quota_and_the_list_shows_it_then_takes_it_away(
    use: Use, capsys: pytest.CaptureFixture[str]
) -> None:
    use("admin")
    assert main(["admin", "user", "quota", "alice", "--accels", "8"]) == 0
    assert "alice's jobs may now hold at most 8 accelerators" in capsys.readouterr().out
    assert main(["admin", "user", "list"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["NAME", "ADMIN", "TOKENS", "QUOTA", "HIGH"]
    alice = next(row.split() for row in rows if row.startswith("alice"))
    assert alice[3:5] == ["8", "no"]
    assert main(["admin", "user", "quota", "alice", "--none"]) == 0
    assert "alice has no quota now" in capsys.readouterr().out


def test_high_priority_is_refused_until_an_admin_allows_it(
    use: Use, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    use("alice")
    assert run_high("urgent", tmp_path) == 1
    assert "flexai admin user high-priority alice --allow" in capsys.readouterr().err
    use("admin")
    assert main(["admin", "user", "high-priority", "alice", "--allow"]) == 0
    assert "alice may now submit priority high jobs" in capsys.readouterr().out
    use("alice")
    assert run_high("urgent", tmp_path) == 0
    capsys.readouterr()
    assert main(["training", "inspect", "urgent"]) == 0
    shown = capsys.readouterr().out
    assert "  priority: high" in shown and "  max retries: 2" in shown
    assert "  retry on exit codes: 137,143" in shown


def test_a_non_admin_cannot_set_a_quota(use: Use, capsys: pytest.CaptureFixture[str]) -> None:
    use("alice")
    assert main(["admin", "user", "quota", "alice", "--accels", "100"]) == 1
    assert "admin" in capsys.readouterr().err
