"""The composition root: every concrete part, built from the settings in one place."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from api.artifacts.archives import ArchiveLimits
from api.artifacts.followers import LogFollowers
from api.artifacts.local import LocalArtifactStore
from api.artifacts.recording import ArtifactRecords
from api.artifacts.settling import LogSettler
from api.artifacts.store import ArtifactStore
from api.artifacts.uploads import UploadSessions
from api.debug.orphans import OrphanParts
from api.debug.presence import FilePresence, LocalPresence, PostgresPresence, Presence
from api.debug.sessions import DebugSessions
from api.http.metrics import ServerMetrics
from api.identity.identities import Identities
from api.identity.secrets import SecretStore, open_secret_store
from api.identity.sessions import Sessions
from api.ledger.format import check_ledger_format
from api.ledger.parts import LedgerParts
from api.runtimes import Runtimes
from api.scheduling.assignments import AssignmentWaiters
from api.scheduling.leadership import AlwaysLeader, FileLeaderLock, LeaderLock, PostgresLeaderLock
from api.scheduling.nodes import OperationalState
from api.scheduling.parts import SchedulingParts
from api.scheduling.waits import Waits
from api.settings import Settings
from domain.application import TrainingJobs
from ledger.database import (
    LEDGER_CHANNEL,
    TOKENS_CHANNEL,
    Database,
    LedgerListener,
    PostgresDatabase,
    open_database,
)
from ledger.group_commit import PostgresGroupCommit
from ledger.schema import schema_lock
from projections.projector import Projector
from projections.queries import Queries
from projections.rebuild import Rebuilder

LEDGER_POLL_S = 1.0
"""On PostgreSQL, how often the views read the ledger when no notification came (a net)."""


@dataclass
class Services:
    settings: Settings
    jobs: TrainingJobs
    database: Database
    projector: Projector
    queries: Queries
    state: OperationalState
    identities: Identities
    artifacts: ArtifactStore
    uploads: UploadSessions
    """Agents' upload sessions (the ``artifact_uploads`` table: any replica continues one)."""
    records: ArtifactRecords
    """Completes agents' uploads and records their artifacts."""
    log_followers: LogFollowers
    waits: Waits
    secrets: SecretStore
    """Users' secrets, sealed with the server's secret key (never in the ledger)."""
    sessions: Sessions
    """The web console's sign-in sessions (server-side, shared by the replicas)."""
    runtimes: Runtimes
    """The images admins name for jobs to run in (``--runtime``)."""
    assignment_waiters: AssignmentWaiters = field(default_factory=AssignmentWaiters)
    debug_sessions: DebugSessions = field(default_factory=DebugSessions)
    """Live `debug-ssh` sessions and their relays (this process's only)."""
    presence: Presence = field(default_factory=LocalPresence)
    """This server process's instance id, and whether other servers' are alive (see
    :mod:`api.debug.presence`): debug sessions name the server that relays them."""
    scheduler_wakeup: threading.Event = field(default_factory=threading.Event)
    leader_lock: LeaderLock = field(default_factory=AlwaysLeader)
    """Held by the one replica whose scheduler runs (see :mod:`api.scheduling.leadership`)."""
    scheduler_leader: threading.Event = field(default_factory=threading.Event)
    """Set while this server's scheduler holds the lock and schedules."""
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    """Requests per route, their latency, scheduler rounds (``/metrics``)."""
    rebuilder: Rebuilder | None = None
    """Rebuilds the views from the ledger (``flexai admin rebuild-projections``)."""
    closers: list[Callable[[], None]] = field(default_factory=list)
    """What else ends with the services (background threads of the parts)."""

    def scheduling(self) -> SchedulingParts:
        """What the scheduler uses (its deadlines and its view of the fleet too)."""
        return SchedulingParts(
            jobs=self.jobs, queries=self.queries, state=self.state, waits=self.waits,
            projector=self.projector, quotas=self.identities.quotas,
            rounds=self.metrics.scheduler_rounds.time, leader_lock=self.leader_lock,
            wakeup=self.scheduler_wakeup, leading=self.scheduler_leader, settings=self.settings,
        )  # fmt: skip

    def orphans(self) -> OrphanParts:
        """What closing the debug sessions of dead servers uses."""
        return OrphanParts(self.jobs, self.queries, self.projector, self.presence)

    def ledger_parts(self) -> LedgerParts:
        """What `admin verify` and `admin purge` use."""
        return LedgerParts(self.jobs, self.database, self.projector, self.queries,
                           self.artifacts)  # fmt: skip

    def close(self) -> None:
        for close in self.closers:
            close()
        self.presence.release()
        self.projector.stop()
        self.jobs.close()
        self.database.close()


def build_services(settings: Settings) -> Services:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    database = open_database(
        settings.resolved_database_url, wait_s=settings.database_wait_s,
        connect_timeout_s=settings.database_connect_timeout_s,
    )  # fmt: skip
    with schema_lock(database):  # replicas starting together make their tables in turn
        return _services(settings, database)


def _services(settings: Settings, database: Database) -> Services:
    jobs = TrainingJobs(env=settings.event_store_env())
    key = settings.ledger_key.get_secret_value() if settings.ledger_key else None
    check_ledger_format(database, jobs, key, settings.compress_events)
    limits = settings.limits
    projector = Projector(jobs, database, skip=settings.skip_events)
    log_followers = LogFollowers(limits.log_followers)
    projector.listeners.append(log_followers.on_events)
    assignment_waiters = AssignmentWaiters()
    projector.listeners.append(assignment_waiters.on_events)
    archive_limits = ArchiveLimits(limits.archive_entries, limits.archive_unpacked_bytes)
    artifacts, closers = open_artifact_store(settings, database, archive_limits)
    if artifacts.kind == "s3":  # the local store writes each log byte to its file at once
        settler = LogSettler(artifacts)
        projector.listeners.append(settler.on_events)
        settler.start()
        closers.insert(0, settler.stop)
    scheduler_wakeup = threading.Event()
    leader_lock: LeaderLock
    presence: Presence
    identities = Identities(database)
    if isinstance(database, PostgresDatabase):
        # Replicas may share this database: views follow the ledger by LISTEN/NOTIFY (and a
        # slow poll), and one replica at a time schedules, woken by others' writes too. A
        # revoked token is forgotten by every replica at once.
        if isinstance(jobs.recorder, PostgresGroupCommit):  # told in the save's own commit
            jobs.recorder.ledger_channel = LEDGER_CHANNEL
        else:
            jobs.after_save = (database.notify_ledger,)
        identities.revoked.append(lambda token_id: database.notify(TOKENS_CHANNEL, token_id))
        listener = LedgerListener(
            database.dedicated_connection, others={TOKENS_CHANNEL: identities.forget}
        )
        projector.follow_by(listener, poll_s=LEDGER_POLL_S)
        projector.followed.append(scheduler_wakeup.set)
        leader_lock = PostgresLeaderLock(database.dedicated_connection)
        presence = PostgresPresence(database.dedicated_connection)
    else:
        sqlite_file = Path(settings.resolved_database_url.removeprefix("sqlite:///"))
        leader_lock = FileLeaderLock(sqlite_file.with_name(sqlite_file.name + ".scheduler-lock"))
        presence = FilePresence(sqlite_file.with_name(sqlite_file.name + ".servers"))
    queries, uploads = Queries(database), UploadSessions(database)
    return Services(
        settings=settings,
        jobs=jobs,
        database=database,
        projector=projector,
        queries=queries,
        state=OperationalState(database),
        identities=identities,
        artifacts=artifacts,
        uploads=uploads,
        records=ArtifactRecords(artifacts, uploads, jobs, projector, queries),
        log_followers=log_followers,
        assignment_waiters=assignment_waiters,
        waits=Waits(database),
        secrets=open_secret_store(database, settings.data_dir),
        sessions=Sessions(database),
        runtimes=Runtimes(database),
        scheduler_wakeup=scheduler_wakeup,
        leader_lock=leader_lock,
        presence=presence,
        rebuilder=Rebuilder(jobs, projector, database),
        closers=closers,
    )


LOG_SWEEP_S = 30.0
"""How often the S3 store looks for held log bytes that waited long enough for the bucket."""


def open_artifact_store(
    settings: Settings, database: Database, limits: ArchiveLimits
) -> tuple[ArtifactStore, list[Callable[[], None]]]:
    """The store the settings name, and what ends its background work. The S3 store's bucket
    must answer (StorageUnavailable saying what is wrong otherwise)."""
    location = settings.s3_location
    if location is None:
        return LocalArtifactStore(settings.data_dir / "artifacts", limits), []
    from api.artifacts.s3 import S3ArtifactStore  # boto3 loads only for an S3 store

    store = S3ArtifactStore(location, database, limits)
    store.check()
    store.sweep_logs(LOG_SWEEP_S)
    return store, [store.close]
