"""The stores bench/ledger.py measures on (fresh SQLite files or PostgreSQL databases, with
raw driver access for the baselines) and the table it prints its figures in."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.settings import Settings
from bench.logpath import timed
from ledger.database import open_database
from projections.views import VIEW_TABLES as VIEWS

VIEW_TABLES = ("projection_tracking", "view_schema", *VIEWS)


# -- measuring ----------------------------------------------------------------------------


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def section(self, title: str) -> None:
        self.rows.append((f"[{title}]", "", "", ""))

    def add(self, measure: str, value: str, baseline: str, ratio: float | None) -> None:
        self.rows.append((measure, value, baseline, "" if ratio is None else f"{ratio:.2f}x"))

    def render(self) -> str:
        header = ("measure", "value", "baseline", "ratio")
        widths = [max(len(row[i]) for row in [header, *self.rows]) for i in range(4)]
        lines = []
        for index, row in enumerate([header, *self.rows]):
            cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in (1, 2, 3)]
            lines.append("  ".join(cells).rstrip())
            if index == 0:
                lines.append("  ".join("-" * width for width in widths))
        return "\n".join(lines)


def rate(count: int, seconds: float, unit: str = "ev/s") -> str:
    return f"{count / seconds:,.0f} {unit}"


def micros(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


# -- stores -------------------------------------------------------------------------------


class Store:
    """One kind of database: fresh ledgers, raw driver access for the baselines."""

    name: str

    @contextmanager
    def fresh(self) -> Iterator[tuple[Settings, Path]]:
        raise NotImplementedError

    def mean_payload(self, url: str) -> int:
        raise NotImplementedError

    @contextmanager
    def raw_inserter(self, url: str) -> Iterator[Callable[[list[bytes]], float]]:
        """A scratch table in the same file/database, and a function that inserts rows into
        it one transaction per row, returning the seconds that took."""
        raise NotImplementedError
        yield

    @contextmanager
    def raw_select_one(self, url: str) -> Iterator[Callable[[], Any]]:
        raise NotImplementedError
        yield

    @contextmanager
    def view_database(self, url: str, work: Path, tag: str) -> Iterator[Any]:
        raise NotImplementedError
        yield


class SQLiteStore(Store):
    name = "sqlite"

    @contextmanager
    def fresh(self) -> Iterator[tuple[Settings, Path]]:
        with tempfile.TemporaryDirectory(prefix="flexai-bench-") as tmp:
            yield Settings(data_dir=Path(tmp)), Path(tmp)

    @staticmethod
    def _path(url: str) -> str:
        return url.removeprefix("sqlite:///")

    def mean_payload(self, url: str) -> int:
        with sqlite3.connect(self._path(url)) as connection:
            (size,) = connection.execute("SELECT AVG(LENGTH(state)) FROM stored_events").fetchone()
        return int(size)

    @contextmanager
    def raw_inserter(self, url: str) -> Iterator[Callable[[list[bytes]], float]]:
        # Same file as the ledger (so same WAL mode), default synchronous, autocommit driver.
        connection = sqlite3.connect(self._path(url), isolation_level=None, timeout=30)
        connection.execute("DROP TABLE IF EXISTS bench_scratch")
        connection.execute(
            "CREATE TABLE bench_scratch (id INTEGER PRIMARY KEY, topic TEXT, state BLOB)"
        )

        def insert(payloads: list[bytes]) -> float:
            def insert_all() -> None:
                for payload in payloads:
                    connection.execute("BEGIN")
                    connection.execute(
                        "INSERT INTO bench_scratch (topic, state) VALUES (?, ?)",
                        ("bench:Event", payload),
                    )
                    connection.execute("COMMIT")

            return timed(insert_all)

        try:
            insert([b"{}"] * 5)  # warm up
            yield insert
        finally:
            connection.execute("DROP TABLE IF EXISTS bench_scratch")
            connection.close()

    @contextmanager
    def raw_select_one(self, url: str) -> Iterator[Callable[[], Any]]:
        connection = sqlite3.connect(self._path(url), isolation_level=None)
        try:
            yield lambda: connection.execute("SELECT 1").fetchone()
        finally:
            connection.close()

    @contextmanager
    def view_database(self, url: str, work: Path, tag: str) -> Iterator[Any]:
        view_url = f"sqlite:///{work / f'views-{tag}.sqlite3'}"
        database = open_database(view_url)
        try:
            yield database, view_url
        finally:
            database.close()


class PostgresStore(Store):
    name = "postgres"

    @contextmanager
    def fresh(self) -> Iterator[tuple[Settings, Path]]:
        from tests.pg import fresh_database

        with tempfile.TemporaryDirectory(prefix="flexai-bench-") as tmp, fresh_database(
            prefix="bench"
        ) as url:
            yield Settings(data_dir=Path(tmp), database_url=url), Path(tmp)

    def mean_payload(self, url: str) -> int:
        import psycopg

        with psycopg.connect(url) as connection:
            row = connection.execute(
                "SELECT AVG(octet_length(state)) FROM flexai_events"
            ).fetchone()
        assert row is not None
        return int(row[0])

    @contextmanager
    def raw_inserter(self, url: str) -> Iterator[Callable[[list[bytes]], float]]:
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS bench_scratch")
            admin.execute(
                "CREATE TABLE bench_scratch (id BIGSERIAL PRIMARY KEY, topic TEXT, state BYTEA)"
            )
        connection = psycopg.connect(url)  # autocommit off: BEGIN, INSERT, COMMIT per row

        def insert(payloads: list[bytes]) -> float:
            def insert_all() -> None:
                for payload in payloads:
                    connection.execute(
                        "INSERT INTO bench_scratch (topic, state) VALUES (%s, %s)",
                        ("bench:Event", payload),
                    )
                    connection.commit()

            return timed(insert_all)

        try:
            insert([b"{}"] * 5)  # warm up
            yield insert
        finally:
            connection.close()
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("DROP TABLE IF EXISTS bench_scratch")

    @contextmanager
    def raw_select_one(self, url: str) -> Iterator[Callable[[], Any]]:
        import psycopg

        connection = psycopg.connect(url, autocommit=True)
        try:
            yield lambda: connection.execute("SELECT 1").fetchone()
        finally:
            connection.close()

    @contextmanager
    def view_database(self, url: str, work: Path, tag: str) -> Iterator[Any]:
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS {', '.join(VIEW_TABLES)}")  # type: ignore[arg-type]
        database = open_database(url)
        try:
            yield database, url
        finally:
            database.close()
