"""One settings object for the server, filled from its command line."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import BaseModel


class Settings(BaseModel):
    data_dir: Path
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    scheduler_interval_s: float = 0.2
    scheduling_patience_s: float = 30.0
    node_timeout_s: float = 30.0
    projection_interval_s: float = 0.25
    write_client_config: bool = True

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'flexai.sqlite3'}"

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def event_store_env(self) -> dict[str, str]:
        """The eventsourcing environment for the configured database."""
        url = self.resolved_database_url
        if url.startswith("sqlite:///"):
            return {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": url.removeprefix("sqlite:///"),
                "SQLITE_LOCK_TIMEOUT": "30",
            }
        parsed = urlparse(url)
        if parsed.scheme not in ("postgresql", "postgres"):
            raise ValueError(
                f"unsupported database URL {url!r}: use postgresql://USER@HOST:PORT/DB "
                "or leave --database-url out for the embedded SQLite file"
            )
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": parsed.path.lstrip("/") or "postgres",
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
            "POSTGRES_POOL_SIZE": "5",
            "POSTGRES_MAX_OVERFLOW": "10",
        }
