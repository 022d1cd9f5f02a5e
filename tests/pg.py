"""Fresh PostgreSQL databases for tests (PostgreSQL 15 on 127.0.0.1:5432, trust auth)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse, urlunparse

POSTGRES_ADMIN_URL = os.environ.get(
    "FLEXAI_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(statement)  # type: ignore[arg-type]


@contextmanager
def fresh_database(prefix: str = "flexai_test") -> Iterator[str]:
    """Create an empty database, yield its URL, drop it afterwards."""
    dbname = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{dbname}"')
    try:
        yield urlunparse(urlparse(POSTGRES_ADMIN_URL)._replace(path=f"/{dbname}"))
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
