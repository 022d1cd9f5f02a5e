"""Shared fixtures: every storage-touching test runs on SQLite and on PostgreSQL; artifact
tests also on a real S3 store (SeaweedFS, one per test session and worker)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import fresh_database
from tests.s3 import SeaweedFS, running_seaweedfs

# The tests' temporary folders (pytest's tmp_path, and every server's, agent's and git's
# temporary files) are not under /tmp: a job in its sandbox has a /tmp of its own, and the tests
# hand their jobs files there (wheels to install, a file that tells a job to go on), which the
# sandbox shows them read-only like the rest of the host.
if os.environ.get("TMPDIR", "/tmp").rstrip("/") in ("", "/tmp") and os.path.isdir("/var/tmp"):
    os.environ["TMPDIR"] = "/var/tmp"
    tempfile.tempdir = None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    with fresh_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for each store: an SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flexai.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """SeaweedFS's S3 gateway on loopback ports, started once per session (and xdist worker)."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket, removed afterwards; the store's credentials in the environment (the
    standard AWS chain)."""
    s3_server.start()  # back, should an earlier test have stopped it and failed
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    with s3_server.bucket() as name:
        yield name
