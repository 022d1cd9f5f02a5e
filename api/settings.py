"""One settings object for the server, filled from its command line."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from api.artifacts.s3_location import S3Location, check_endpoint, check_region, check_url
from common.contract import DEFAULT_REPOSITORY_KINDS, REPOSITORY_KINDS

MiB = 2**20
GiB = 2**30


class Limits(BaseModel):
    """What one request may cost; each is a flag of ``flexai server``."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    request_bytes: int = Field(default=1 * MiB, ge=1024)
    """A JSON body: a job submission, a report, a registration."""
    log_chunk_bytes: int = Field(default=4 * MiB, ge=1024)
    """One batch of log bytes an agent ships."""
    upload_bytes: int = Field(default=64 * GiB, ge=1024)
    """One checkpoint, output or dataset archive, as uploaded (compressed)."""
    archive_entries: int = Field(default=100_000, ge=1)
    """Files and directories in one archive."""
    archive_unpacked_bytes: int = Field(default=256 * GiB, ge=1024)
    """What one archive unpacks to (a zip bomb's tell)."""
    log_followers: int = Field(default=10_000, ge=1)
    """`logs --follow` streams open at once; one more is answered 503."""


class Settings(BaseModel):
    data_dir: Path
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    scheduler_interval_s: float = 0.2
    scheduling_patience_s: float = 30.0
    node_timeout_s: float = 30.0
    preempt_after_s: float | None = Field(default=120.0, ge=0)
    """How long a waiting job waits for accelerators before it preempts running jobs of lower
    priority (``--preempt-after``; None: never)."""
    require_isolation: bool = False
    """Place jobs only on nodes whose agent runs each job in a sandbox of its own."""
    agent_client_certificates: bool = False
    """Agents' requests need a TLS client certificate (signed by ``--agent-client-ca``'s CA,
    which the handshake checks) besides their node token."""
    projection_interval_s: float = 0.25
    stop_confirm_timeout_s: float = Field(default=60.0, gt=0)
    """After a job's stop grace, how long a node has to confirm a stop before it fails."""
    default_time_limit_s: int | None = Field(default=None, ge=1)
    """The time limit of jobs submitted without one (None: no limit)."""
    database_wait_s: float = Field(default=1.5, gt=0)
    """How long a request waits for a PostgreSQL connection before it is answered 503
    ``database-unavailable`` (kept under the 2 s within which that answer is due)."""
    database_connect_timeout_s: int = Field(default=2, ge=2)
    """Each attempt to connect to PostgreSQL, in whole seconds (libpq's least is 2)."""
    write_client_config: bool = True
    limits: Limits = Field(default_factory=Limits)
    ledger_key: SecretStr | None = None
    """The base64 AES key the ledger's events are encrypted with (``--ledger-key-file``)."""
    compress_events: bool = False
    """Stored events are compressed with zlib (``--compress-events``)."""
    allowed_repo_schemes: frozenset[str] = frozenset(DEFAULT_REPOSITORY_KINDS)
    """The kinds of repository URL jobs may name (``--allowed-repo-schemes``): keys of
    ``common.contract.REPOSITORY_KINDS``; git option and transport-helper URLs never pass."""
    skip_events: frozenset[int] = frozenset()
    """Ledger positions the views pass over (an operator's way past an event they cannot
    apply, after reading it with the audit routes)."""

    artifact_store: str | None = None
    """``s3://BUCKET[/PREFIX]``: artifacts in that bucket (``--artifact-store``); None: files
    under the data directory."""
    s3_endpoint_url: str | None = None
    """An S3-compatible store's endpoint (``--s3-endpoint-url``); None: AWS S3."""
    s3_region: str | None = None
    """The bucket's region (``--s3-region``); None: the AWS environment's."""

    @field_validator("artifact_store")
    @classmethod
    def _s3_url(cls, url: str | None) -> str | None:
        if url is not None:
            check_url(url)
        return url

    @field_validator("s3_endpoint_url", "s3_region")
    @classmethod
    def _s3_options(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not info.data.get("artifact_store"):
            raise ValueError("applies to an S3 store only: give --artifact-store s3://BUCKET")
        return check_endpoint(value) if info.field_name == "s3_endpoint_url" else check_region(
            value
        )

    @property
    def s3_location(self) -> S3Location | None:
        """Where the S3 store keeps things; None for the local store."""
        if self.artifact_store is None:
            return None
        return S3Location.parse(self.artifact_store, self.s3_endpoint_url, self.s3_region)

    @field_validator("allowed_repo_schemes")
    @classmethod
    def _known_kinds(cls, kinds: frozenset[str]) -> frozenset[str]:
        unknown = sorted(kinds - set(REPOSITORY_KINDS))
        if unknown:
            raise ValueError(f"unknown kind {unknown[0]!r}: use some of "
                             f"{', '.join(REPOSITORY_KINDS)}")  # fmt: skip
        return kinds

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'flexai.sqlite3'}"

    def event_store_env(self) -> dict[str, str]:
        """The eventsourcing environment for the configured database."""
        from api.ledger.format import store_env

        key = self.ledger_key.get_secret_value() if self.ledger_key else None
        return {**self._database_env(), **store_env(key, self.compress_events)}

    def _database_env(self) -> dict[str, str]:
        url = self.resolved_database_url
        if url.startswith("sqlite:///"):
            return {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "APPLICATION_RECORDER_TOPIC": "ledger.chain:ChainedSQLiteRecorder",
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
            "PERSISTENCE_MODULE": "ledger.database:PostgresEventStore",
            "APPLICATION_RECORDER_TOPIC": "ledger.chain:ChainedPostgresRecorder",
            "POSTGRES_DBNAME": parsed.path.lstrip("/") or "postgres",
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
            "POSTGRES_POOL_SIZE": "5",
            "POSTGRES_MAX_OVERFLOW": "10",
            "POSTGRES_POOL_WAIT": str(self.database_wait_s),
            "POSTGRES_CONNECT_TIMEOUT": str(self.database_connect_timeout_s),
        }
