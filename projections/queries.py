"""Read-only queries over the views: what list, inspect, the scheduler and agents see."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import Any

from domain.statuses import ON_A_NODE, Status
from ledger.database import Database, Row

DATASET_COLUMNS = "name, version, content_hash, size, files, created_at, pushed_at, pushed_by"
SUMMARY_COLUMNS = (
    "id, owner, name, status, accels, nodes, node, created_at, started_at, ended_at, updated_at"
)
NEWEST_FIRST = "created_at DESC, id DESC"
"""The order of job lists; the id breaks ties, so that a page cursor is one exact place."""


def page_jobs_sql(
    owner: str | None,
    limit: int,
    after: tuple[str, str] | None = None,
    statuses: Collection[Status] = (),
    name_prefix: str = "",
) -> tuple[str, list[Any]]:
    """The query of one page of jobs, and its parameters.

    Keyset pagination: a page is a backward range scan of ``job_list_owner_newest`` (or of
    ``job_list_owner_status_newest`` for one status; every owner's: ``job_list_newest`` and
    ``job_list_status_newest``), however deep it lies, never an OFFSET;
    and jobs created meanwhile sort before ``after``, so they never shift a later page.
    """
    where: list[str] = ["deleted_at IS NULL"]
    params: list[Any] = []
    if owner is not None:  # None: every owner's (``job_list_newest``)
        where.append("owner = ?")
        params.append(owner)
    if statuses:
        wanted = sorted({status.value for status in statuses})
        where.append(f"status IN ({', '.join('?' * len(wanted))})")
        params += wanted
    if name_prefix:  # literal and case-sensitive on both stores: no LIKE wildcards to escape
        where.append("substr(name, 1, ?) = ?")
        params += [len(name_prefix), name_prefix]
    if after is not None and owner is not None and not statuses:
        # The owner in the row too: PostgreSQL then ranges over job_list_owner_newest even on
        # fresh statistics, rather than over job_list_newest filtering on the owner. The
        # pair as well: PostgreSQL (before 18) starts a backward scan from the bound on
        # created_at, which only a condition that leads with it gives (with the row alone it
        # starts from the owner's newest job and reads every row down to the page: 140 ms
        # half-way down a million jobs, 0.1 ms with the pair).
        where.append("(owner, created_at, id) < (?, ?, ?) AND (created_at, id) < (?, ?)")
        params += [owner, *after, *after]
    elif after is not None:
        where.append("(created_at, id) < (?, ?)")
        params += [*after]
    sql = (f"SELECT {SUMMARY_COLUMNS} FROM job_list WHERE {' AND '.join(where)} "
           f"ORDER BY {NEWEST_FIRST} LIMIT ?")  # fmt: skip
    return sql, [*params, limit]


LINE_COLUMNS = "id, owner, name, status, accels, nodes, node_id, created_at, updated_at"
"""A job's list row as the scheduler reads it."""
USAGE_INTERVALS = (
    "SELECT owner, accels * nodes AS accels, started_at, ended_at FROM job_list "
    "WHERE started_at IS NOT NULL AND ended_at IS NULL UNION ALL "
    "SELECT owner, accels * nodes AS accels, started_at, ended_at FROM job_list "
    "WHERE started_at IS NOT NULL AND ended_at >= ?"
)
"""The jobs that run and those that ended since: two range scans of ``job_list_ran`` (one
``OR`` would read every job)."""
COUNT_SCHEDULING = "SELECT COUNT(*) AS n FROM job_list WHERE status = ? AND deleted_at IS NULL"
PLACES = (
    "SELECT (SELECT COUNT(*) FROM job_list o WHERE o.status = j.status AND "
    "o.deleted_at IS NULL AND (o.created_at, o.id) < (j.created_at, j.id)) AS ahead, "
    f"({COUNT_SCHEDULING}) AS n FROM job_list j WHERE j.status = ? AND j.id = ?"
)
"""A waiting job's count of those ahead of it and of all (a job in ``scheduling`` is never
deleted: both count in ``job_list_status_newest``)."""


class Queries:
    def __init__(self, database: Database) -> None:
        self.database = database

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Row]:
        with self.database.transaction() as cursor:
            cursor.execute(sql, tuple(params))
            return cursor.fetchall()

    def _one(self, sql: str, params: Iterable[Any] = ()) -> Row | None:
        rows = self._all(sql, params)
        return rows[0] if rows else None

    def list_jobs(self, owner: str) -> list[Row]:
        """Every live job of the owner's, newest first (unpaged: for internal callers)."""
        return self._all(
            f"SELECT {SUMMARY_COLUMNS} FROM job_list WHERE owner = ? AND deleted_at IS NULL "
            f"ORDER BY {NEWEST_FIRST}",
            (owner,),
        )

    def page_jobs(
        self,
        owner: str | None,
        limit: int,
        *,
        after: tuple[str, str] | None = None,
        statuses: Collection[Status] = (),
        name_prefix: str = "",
    ) -> list[Row]:
        """Up to ``limit`` live jobs of the owner's, newest first, from just past ``after``
        (the last row seen: its created_at and id) on; see :func:`page_jobs_sql`."""
        return self._all(*page_jobs_sql(owner, limit, after, statuses, name_prefix))

    def jobs_by_ids(self, job_ids: Collection[str]) -> list[Row]:
        """The summaries of these jobs (live or deleted), in no order."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return []
        marks = ", ".join("?" * len(wanted))
        return self._all(
            f"SELECT {SUMMARY_COLUMNS}, deleted_at FROM job_list WHERE id IN ({marks})", wanted
        )

    def jobs_per_status(self) -> dict[str, int]:
        """Live (not deleted) jobs of every owner, by status."""
        rows = self._all("SELECT status, COUNT(*) AS n FROM job_list WHERE deleted_at IS NULL "
                         "GROUP BY status")  # fmt: skip
        return {str(row["status"]): int(row["n"]) for row in rows}

    def job_by_name(self, owner: str, name: str) -> dict[str, Any] | None:
        row = self._one(
            "SELECT d.document FROM job_list l JOIN job_details d ON d.id = l.id "
            "WHERE l.owner = ? AND l.name = ? AND l.deleted_at IS NULL",
            (owner, name),
        )
        return json.loads(row["document"]) if row else None

    def job(self, job_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT document FROM job_details WHERE id = ?", (job_id,))
        return json.loads(row["document"]) if row else None

    def jobs(self, job_ids: Collection[str]) -> dict[str, dict[str, Any]]:
        """The documents of these jobs (as :meth:`job` reads each), by id, in one read."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))
        rows = self._all(f"SELECT id, document FROM job_details WHERE id IN ({marks})", wanted)
        return {str(row["id"]): json.loads(row["document"]) for row in rows}

    def deleted_jobs(self) -> list[dict[str, Any]]:
        """Every deleted job (``admin purge``), oldest deletion first, as inspect shows it."""
        rows = self._all(
            "SELECT d.document FROM job_list l JOIN job_details d ON d.id = l.id "
            "WHERE l.deleted_at IS NOT NULL ORDER BY l.deleted_at, l.id"
        )
        return [json.loads(row["document"]) for row in rows]

    def jobs_ever_named(self, owner: str, name: str) -> list[Row]:
        """Every job that held ``name``, deleted ones included (for audit)."""
        return self._all(
            "SELECT id, name, status, created_at, deleted_at FROM job_list "
            "WHERE owner = ? AND name = ? ORDER BY created_at",
            (owner, name),
        )

    def on_nodes(self) -> list[Row]:
        """Every job placed on a node (building to stopping): one row per node of it."""
        marks = ", ".join("?" * len(ON_A_NODE))
        return self._all(f"SELECT job_id, node_id, status, accels FROM job_nodes "
                         f"WHERE status IN ({marks})", [s.value for s in ON_A_NODE])  # fmt: skip

    def usage_intervals(self, since: str) -> list[Row]:
        """Each job that ran since ``since`` (or runs): its owner, the accelerators it held
        on all its nodes, and when it started and ended (None: it runs)."""
        return self._all(USAGE_INTERVALS, (since,))

    def jobs_in(self, statuses: Iterable[Status]) -> list[Row]:
        wanted = [status.value for status in statuses]
        marks = ", ".join("?" * len(wanted))
        return self._all(
            f"SELECT {LINE_COLUMNS} FROM job_list WHERE status IN ({marks}) ORDER BY created_at",
            wanted,
        )

    def list_rows(self, job_ids: Collection[str]) -> dict[str, Row]:
        """The list rows of these jobs (the columns :meth:`jobs_in` reads), by id."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))
        rows = self._all(f"SELECT {LINE_COLUMNS} FROM job_list WHERE id IN ({marks})", wanted)
        return {str(row["id"]): row for row in rows}

    def assignments(self, node_id: str) -> list[dict[str, Any]]:
        """The node's jobs on it (building to stopping), each with ``node_index``: its place
        among the job's nodes."""
        marks = ", ".join("?" * len(ON_A_NODE))
        rows = self._all(
            f"SELECT d.document, n.node_index FROM job_nodes n JOIN job_details d "
            f"ON d.id = n.job_id WHERE n.node_id = ? AND n.status IN ({marks}) "
            "ORDER BY n.created_at, n.job_id",
            [node_id, *(status.value for status in ON_A_NODE)],
        )
        return [{**json.loads(row["document"]), "node_index": int(row["node_index"])}
                for row in rows]  # fmt: skip

    def node_load(self) -> dict[str, tuple[int, int]]:
        """Per node: accelerators held by running jobs, and asked for by jobs building or
        waiting there."""
        marks = ", ".join("?" * len(ON_A_NODE))
        rows = self._all(
            f"SELECT node_id, status, SUM(accels) AS accels FROM job_nodes "
            f"WHERE status IN ({marks}) GROUP BY node_id, status",
            [status.value for status in ON_A_NODE],
        )
        load: dict[str, tuple[int, int]] = {}
        for row in rows:
            held, queued = load.get(row["node_id"], (0, 0))
            if row["status"] in (Status.IN_PROGRESS.value, Status.STOP_IN_PROGRESS.value):
                held += int(row["accels"])
            else:
                queued += int(row["accels"])
            load[row["node_id"]] = (held, queued)
        return load

    def busy_accels(self) -> dict[str, int]:
        """Accelerators each node holds or is asked for by jobs on it."""
        return {node_id: held + queued for node_id, (held, queued) in self.node_load().items()}

    def place_in_scheduling(self, job_id: str) -> tuple[int, int]:
        """A job's place among the jobs not placed yet (oldest first), and how many there are:
        counted in ``job_list_status_newest``, not read (30,000 waiting: 30 ms read)."""
        waiting = Status.SCHEDULING.value
        with self.database.transaction() as cursor:
            cursor.execute(PLACES, (waiting, waiting, job_id))
            row = cursor.fetchone()
            if row is None:  # not waiting to be placed
                cursor.execute(COUNT_SCHEDULING, (waiting,))
                counted = cursor.fetchone()
                return 0, int(counted["n"]) if counted else 0
        return int(row["ahead"]) + 1, int(row["n"])

    def jobs_on_node(self, node_id: str) -> list[str]:
        """The jobs placed on the node, those that wait first: when the node is lost, they
        must leave its line before a running job lets go of its accelerators there."""
        marks = ", ".join("?" * len(ON_A_NODE))
        rows = self._all(
            f"SELECT DISTINCT job_id, status FROM job_nodes "
            f"WHERE node_id = ? AND status IN ({marks})",
            [node_id, *(status.value for status in ON_A_NODE)],
        )
        first = {Status.ENQUEUED.value: 0, Status.BUILDING.value: 1}
        rows.sort(key=lambda row: first.get(row["status"], 2))
        return [str(row["job_id"]) for row in rows]

    def holders(self, node_id: str) -> list[Row]:
        """Jobs placed on the node, with their indices there (for explaining waits)."""
        marks = ", ".join("?" * len(ON_A_NODE))
        rows = self._all(
            f"SELECT n.job_id, l.name, l.owner, n.status, n.accels, n.allocated, n.created_at "
            f"FROM job_nodes n JOIN job_list l ON l.id = n.job_id "
            f"WHERE n.node_id = ? AND n.status IN ({marks}) ORDER BY n.created_at, n.job_id",
            [node_id, *(status.value for status in ON_A_NODE)],
        )
        return [{**row, "allocated": json.loads(row["allocated"])} for row in rows]

    def nodes(self) -> list[Row]:
        return self._all(
            "SELECT id, name, accels, accel_type, address, gpus, isolation, registered_at "
            "FROM nodes"
        )

    def checkpoints(self, job_id: str) -> list[Row]:
        return self._all(
            "SELECT id, name, node, step, train_loss, eval_loss, model, version, "
            "inference_ready, size, archive_size, sha256, created_at FROM checkpoints "
            "WHERE job_id = ? "
            "ORDER BY position",
            (job_id,),
        )

    def checkpoint(self, owner: str, id_or_name: str) -> Row | None:
        """A checkpoint of the owner's, by id or (the newest with that) name."""
        return self._one(
            "SELECT id, job_id, name FROM checkpoints WHERE owner = ? AND (id = ? OR name = ?) "
            "ORDER BY CASE WHEN id = ? THEN 0 ELSE 1 END, position DESC",
            (owner, id_or_name, id_or_name, id_or_name),
        )

    def checkpoint_archive(self, checkpoint_id: str) -> Row | None:
        """The job, name, archive size and SHA-256 (None before they were recorded) of a
        checkpoint."""
        return self._one(
            "SELECT job_id, name, archive_size, sha256 FROM checkpoints WHERE id = ?",
            (checkpoint_id,),
        )

    def node_exists(self, node_id: str) -> bool:
        return self._one("SELECT id FROM nodes WHERE id = ?", (node_id,)) is not None

    def open_debug_sessions(self) -> list[Row]:
        """The debug sessions the ledger holds open, each with its relay (the server process
        that relays it, if recorded) and its job's status and end."""
        return self._all(
            "SELECT s.job_id, s.id, s.relay, s.opened_at, l.status, l.ended_at "
            "FROM debug_sessions s LEFT JOIN job_list l ON l.id = s.job_id "
            "WHERE s.closed_at IS NULL ORDER BY s.opened_at, s.id"
        )

    # -- datasets -------------------------------------------------------------------------

    def datasets(self, owner: str) -> list[Row]:
        """The owner's datasets that hold a version, by name, each with its latest version."""
        return self._all(
            f"SELECT {DATASET_COLUMNS} FROM datasets WHERE owner = ? "
            "AND content_hash IS NOT NULL ORDER BY name",
            (owner,),
        )

    def dataset(self, owner: str, name: str) -> Row | None:
        return self._one(
            f"SELECT {DATASET_COLUMNS} FROM datasets WHERE owner = ? AND name = ? "
            "AND content_hash IS NOT NULL",
            (owner, name),
        )

    def dataset_versions(self, owner: str, name: str) -> list[Row]:
        """Every version of the dataset, newest first."""
        return self._all(
            "SELECT v.version, v.content_hash, v.size, v.files, v.pushed_at, v.pushed_by "
            "FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id "
            "WHERE d.owner = ? AND d.name = ? ORDER BY v.version DESC",
            (owner, name),
        )

    def dataset_hashes(self, owner: str, names: Iterable[str]) -> dict[str, str]:
        """The content hash of each named dataset's latest version; unknown names left out."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))
        rows = self._all(
            f"SELECT name, content_hash FROM datasets WHERE owner = ? AND name IN ({marks}) "
            "AND content_hash IS NOT NULL",
            [owner, *wanted],
        )
        return {str(row["name"]): str(row["content_hash"]) for row in rows}
