"""Shared fixtures: every storage-touching test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest

POSTGRES_ADMIN_URL = os.environ.get(
    "FLEXAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _with_database(url: str, dbname: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{dbname}"))


def _admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(statement)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    dbname = f"flexai_test_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{dbname}"')
    try:
        yield _with_database(POSTGRES_ADMIN_URL, dbname)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for each store: an SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flexai.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
