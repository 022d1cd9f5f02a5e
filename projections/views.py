"""The view tables and how each ledger event changes them."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from common.job_spec import JobSpec
from domain.events import event_facts, event_name
from domain.job_attempts import JOB_EVENT_PREFIXES
from domain.lifecycle import EVENT_STATUS
from domain.statuses import TERMINAL, Status
from ledger.database import Cursor
from ledger.schema import create_schema
from projections.attempts import ATTEMPT_FOLDERS, close_attempt, open_attempt
from projections.datasets import DATASET_SCHEMA, apply_dataset_event
from projections.debug_sessions import (
    DEBUG_SESSION_EVENTS,
    DEBUG_SESSION_SCHEMA,
    apply_debug_session_event,
)
from projections.documents import dump_json
from projections.endings import exited, failed, stop_failed, stop_requested, stopped

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS projection_tracking (
        name TEXT PRIMARY KEY, position BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS job_list (
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL,
        accels BIGINT NOT NULL, nodes BIGINT NOT NULL, node TEXT, node_id TEXT,
        created_at TEXT NOT NULL, started_at TEXT, ended_at TEXT, updated_at TEXT NOT NULL,
        deleted_at TEXT, position BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS job_list_owner_name ON job_list (owner, name)",
    "CREATE INDEX IF NOT EXISTS job_list_status ON job_list (status)",
    # A page of `GET /v1/jobs` is a backward range scan of one of these (live rows only).
    # Created on every start if missing, so adding them needs no VIEWS_VERSION bump (which
    # would replay the whole ledger).
    """CREATE INDEX IF NOT EXISTS job_list_owner_newest ON job_list (owner, created_at, id)
        WHERE deleted_at IS NULL""",
    """CREATE INDEX IF NOT EXISTS job_list_newest ON job_list (created_at, id)
        WHERE deleted_at IS NULL""",
    """CREATE INDEX IF NOT EXISTS job_list_owner_status_newest
        ON job_list (owner, status, created_at, id) WHERE deleted_at IS NULL""",
    # Every owner's jobs of one status (an admin's list, the web console's jobs page).
    """CREATE INDEX IF NOT EXISTS job_list_status_newest
        ON job_list (status, created_at, id) WHERE deleted_at IS NULL""",
    # Inspect's lookup by name: without it, PostgreSQL on fresh statistics (views just
    # rebuilt) prefers the partial index above to job_list_owner_name and scans every job.
    """CREATE INDEX IF NOT EXISTS job_list_owner_live_name ON job_list (owner, name)
        WHERE deleted_at IS NULL""",
    # The jobs that ran, for fair share's usage (re-summed every 10 s): without it, every job
    # ever submitted is read each time (a million: 70 ms on SQLite, every 10 s).
    """CREATE INDEX IF NOT EXISTS job_list_ran ON job_list (ended_at)
        WHERE started_at IS NOT NULL""",
    """CREATE TABLE IF NOT EXISTS job_details (
        id TEXT PRIMARY KEY, document TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        id TEXT PRIMARY KEY, job_id TEXT NOT NULL, owner TEXT NOT NULL, name TEXT NOT NULL,
        node TEXT, size BIGINT, step BIGINT, train_loss DOUBLE PRECISION,
        eval_loss DOUBLE PRECISION, model TEXT, version TEXT, inference_ready BIGINT NOT NULL,
        archive_size BIGINT, sha256 TEXT, created_at TEXT NOT NULL, position BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS checkpoints_job ON checkpoints (job_id)",
    """CREATE TABLE IF NOT EXISTS nodes (
        id TEXT PRIMARY KEY, name TEXT NOT NULL, accels BIGINT NOT NULL,
        accel_type TEXT NOT NULL, address TEXT, gpus TEXT NOT NULL DEFAULT '[]',
        isolation TEXT, registered_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS job_nodes (
        job_id TEXT NOT NULL, node_index BIGINT NOT NULL, node_id TEXT NOT NULL,
        node_name TEXT NOT NULL, status TEXT NOT NULL, accels BIGINT NOT NULL,
        allocated TEXT NOT NULL, created_at TEXT NOT NULL,
        PRIMARY KEY (job_id, node_index))""",
    "CREATE INDEX IF NOT EXISTS job_nodes_node ON job_nodes (node_id, status)",
    *DATASET_SCHEMA,
    *DEBUG_SESSION_SCHEMA,
]
VIEW_TABLES = ("job_list", "job_details", "checkpoints", "nodes", "job_nodes", "datasets",
               "dataset_versions", "debug_sessions")  # fmt: skip
VIEWS_VERSION = 5
"""Raised whenever a view table changes shape: the views are then rebuilt from the ledger."""


def create_tables(cursor: Cursor) -> None:
    create_schema(cursor, SCHEMA)


def _iso(moment: datetime) -> str:
    return moment.isoformat()


VIEWED_NODE_EVENTS = ("Node.Registered", "Node.Updated")


def is_viewed(topic: str) -> bool:
    """Whether :func:`apply_event` changes the views for an event stored under ``topic`` (a
    bulk fold decodes no other: a name's claims, a node's allocations)."""
    qualname = topic.rpartition(":")[2]
    return qualname.startswith((*JOB_EVENT_PREFIXES, "Dataset.")) or qualname in VIEWED_NODE_EVENTS


def apply_event(cursor: Cursor, domain_event: Any, position: int) -> None:
    """Change the views for one event; called once per event, inside the tracking transaction."""
    topic = type(domain_event).__qualname__
    if topic.startswith(JOB_EVENT_PREFIXES):
        _apply_job_event(cursor, domain_event, position)
    elif topic.startswith("Node."):
        _apply_node_event(cursor, domain_event)
    elif topic.startswith("Dataset."):
        apply_dataset_event(cursor, domain_event, position)


def _apply_node_event(cursor: Cursor, domain_event: Any) -> None:
    at = _iso(domain_event.timestamp)
    node_id = str(domain_event.originator_id)
    name = event_name(domain_event)
    address = getattr(domain_event, "address", None)
    gpus = json.dumps(getattr(domain_event, "gpus", None) or [])
    isolation = getattr(domain_event, "isolation", None)
    isolation = json.dumps(isolation) if isolation is not None else None
    if name == "Registered":
        cursor.execute(
            "INSERT INTO nodes (id, name, accels, accel_type, address, gpus, isolation, "
            "registered_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (node_id, domain_event.name, domain_event.accels, domain_event.accel_type, address,
             gpus, isolation, at, at),
        )  # fmt: skip
    elif name == "Updated":
        cursor.execute(
            "UPDATE nodes SET accels = ?, accel_type = ?, address = ?, gpus = ?, isolation = ?, "
            "updated_at = ? WHERE id = ?",
            (domain_event.accels, domain_event.accel_type, address, gpus, isolation, at,
             node_id),
        )  # fmt: skip
    # Allocated, Released, Queued, Dequeued: the job views say who holds what.


def _apply_job_event(cursor: Cursor, domain_event: Any, position: int) -> None:
    document = None
    if event_name(domain_event) != "Submitted":
        cursor.execute("SELECT document FROM job_details WHERE id = ?",
                       (str(domain_event.originator_id),))  # fmt: skip
        row = cursor.fetchone()
        if row is None:
            return
        document = json.loads(row["document"])
    document = fold_job_event(cursor, document, domain_event, position)
    if document is not None:
        _write(cursor, document, position)


def fold_job_event(
    cursor: Cursor, document: dict[str, Any] | None, domain_event: Any, position: int,
    at: str | None = None,
) -> dict[str, Any] | None:
    """The job's document with one more of its events folded in (None before its
    ``Submitted``); the event's checkpoint or debug session rows are written by ``cursor``.
    The job's own rows are the caller's to write (:func:`job_rows`): once per event here,
    once per job in a bulk fold (:mod:`projections.bulk`). ``at``: the event's time as ISO
    text, where the caller read it so."""
    name = event_name(domain_event)
    at = at or _iso(domain_event.timestamp)
    if name == "Submitted":
        document = _new_document(str(domain_event.originator_id), domain_event, at)
    elif document is None:
        return None
    _fold(document, name, domain_event, at)
    if name == "CheckpointRecorded":
        _insert_checkpoint(cursor, document, domain_event.checkpoint, at, position)
    elif name in DEBUG_SESSION_EVENTS:
        apply_debug_session_event(cursor, name, domain_event, position)
    return document


def _new_document(job_id: str, submitted: Any, at: str) -> dict[str, Any]:
    spec = JobSpec.from_dict(submitted.spec)
    return {
        "id": job_id, "name": submitted.name, "owner": submitted.owner, "spec": submitted.spec,
        "status": Status.PENDING.value, "accels": spec.accels,
        "nodes": spec.nodes, "node": None, "node_id": None, "commit": None,
        "accelerators": [],
        "created_at": at, "updated_at": at, "started_at": None, "ended_at": None,
        "deleted_at": None,
        "failure": None, "stop": None, "logs_unavailable": None, "outputs": [],
        "placements": [], "rendezvous": None, "waiting_on": [],
        "attempt": 1, "attempts": [], "preemption": None, "last_checkpoint_id": None,
        "retries_left": spec.max_retries,
        "history": [],
    }  # fmt: skip


def _node_assigned(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["node"], document["node_id"] = facts["node_name"], facts["node_id"]
    placed = facts.get("nodes") or [
        {"node_id": facts["node_id"], "node_name": facts["node_name"], "address": None}
    ]
    document["placements"] = [
        {"index": index, "node": node["node_name"], "node_id": node["node_id"],
         "address": node.get("address"), "built": False, "accelerators": [],
         "exit_code": None}
        for index, node in enumerate(placed)
    ]  # fmt: skip


def _requeued(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["node"] = document["node_id"] = None
    document["placements"], document["rendezvous"], document["waiting_on"] = [], None, []


def _built(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["commit"] = facts.get("commit") or document["commit"]
    index = facts.get("node_index")
    if index is not None and index < len(document["placements"]):
        document["placements"][index]["built"] = True
        if facts.get("image_digest"):
            document["placements"][index]["image_digest"] = facts["image_digest"]
            if index == 0 or not document.get("image_digest"):
                document["image_digest"] = facts["image_digest"]
    if facts.get("master_port") is not None and document["placements"]:
        address = document["placements"][0].get("address") or "127.0.0.1"
        document["rendezvous"] = {"master_addr": address, "master_port": facts["master_port"]}


def _enqueued(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    _built(document, {"commit": facts.get("commit")}, at)
    document["waiting_on"] = facts.get("waiting_on") or []


def _started(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    _built(document, {"commit": facts.get("commit")}, at)
    document["accelerators"] = facts.get("accelerators", [])
    allocations = facts.get("allocations") or [document["accelerators"]]
    for node, indices in zip(document["placements"], allocations, strict=False):
        node["accelerators"] = indices
    document["waiting_on"] = []
    document["started_at"] = document["started_at"] or at
    open_attempt(document, at)


def _build_failed(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    _built(document, facts, at)
    failed(document, facts, at)


def _logs_unavailable(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["logs_unavailable"] = {
        "message": facts["message"], "offset": facts["offset"], "written": facts["written"],
        "at": at,
    }  # fmt: skip


def _outputs_recorded(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    """One entry per node index: the archive recorded last."""
    index = facts["node_index"]
    kept = [entry for entry in document.get("outputs") or [] if entry["node_index"] != index]
    recorded = {"node_index": index, "size": facts["size"], "sha256": facts["sha256"], "at": at}
    document["outputs"] = sorted([*kept, recorded], key=lambda entry: entry["node_index"])


def _deleted(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["deleted_at"] = at


def _artifacts_purged(document: dict[str, Any], facts: dict[str, Any], at: str) -> None:
    document["artifacts_purged"] = {"at": at, "objects": facts["objects"]}


FOLDERS: dict[str, Callable[[dict[str, Any], dict[str, Any], str], None]] = {
    **ATTEMPT_FOLDERS,
    "NodeAssigned": _node_assigned,
    "Requeued": _requeued,
    "Built": _built,
    "Enqueued": _enqueued,
    "Started": _started,
    "NodeExited": exited,
    "Succeeded": exited,
    "BuildFailed": _build_failed,
    "Rejected": failed,
    "Failed": failed,
    "StopFailed": stop_failed,
    "StopRequested": stop_requested,
    "Stopped": stopped,
    "LogsUnavailable": _logs_unavailable,
    "OutputsRecorded": _outputs_recorded,
    "Deleted": _deleted,
    "ArtifactsPurged": _artifacts_purged,
}


def _ended(document: dict[str, Any], ended_at: str | None, at: str) -> str:
    """When the job ended: as its node said (``ended_at``), from its start to the event's time
    ``at``; else ``at``."""
    said, started = ended_at and datetime.fromisoformat(ended_at), document["started_at"]
    if not said or said > datetime.fromisoformat(at):
        return at
    return started if started and said < datetime.fromisoformat(started) else str(ended_at)


def _fold(document: dict[str, Any], name: str, domain_event: Any, at: str) -> None:
    facts = event_facts(domain_event)
    status = EVENT_STATUS.get(name)
    if status is not None:
        document["status"] = status.value
        if status in TERMINAL:
            document["ended_at"] = end = _ended(document, facts.get("ended_at"), at)
            close_attempt(document, end, status.value)
    folder = FOLDERS.get(name)
    if folder is not None:
        # A stop's folder also reads who asked for it.
        folder(document, {**facts, "by": domain_event.by} if name == "StopRequested" else facts,
               at)  # fmt: skip
    document["updated_at"] = at
    document["history"].append(
        {
            "event": name,
            "status": document["status"],
            "at": at,
            "by": domain_event.by,
            "facts": _public_facts(name, facts),
        }
    )


def _public_facts(name: str, facts: dict[str, Any]) -> dict[str, Any]:
    if name == "Submitted":
        return {}
    if name == "CheckpointRecorded":
        checkpoint = facts["checkpoint"]
        return {key: checkpoint.get(key)
                for key in ("id", "name", "size", "step", "archive_size", "sha256")
                if key in checkpoint}  # fmt: skip
    return facts


JOB_LIST_COLUMNS = (
    "id", "owner", "name", "status", "accels", "nodes", "node", "node_id", "created_at",
    "started_at", "ended_at", "updated_at", "deleted_at", "position",
)  # fmt: skip
JOB_DETAILS_COLUMNS = ("id", "document")
JOB_NODES_COLUMNS = ("job_id", "node_index", "node_id", "node_name", "status", "accels",
                     "allocated", "created_at")  # fmt: skip


def job_rows(
    document: dict[str, Any], position: int
) -> tuple[tuple[Any, ...], tuple[str, str], list[tuple[Any, ...]]]:
    """A job's rows in ``job_list``, ``job_details`` and ``job_nodes`` (its placements, for
    the node-side queries: assignments, load, node loss), in their tables' column order."""
    listed = (*(document[column] for column in JOB_LIST_COLUMNS[:-1]), position)
    nodes = [(document["id"], node["index"], node["node_id"], node["node"], document["status"],
              document["accels"], dump_json(node["accelerators"]), document["created_at"])
             for node in document.get("placements", [])]  # fmt: skip
    return listed, (document["id"], dump_json(document)), nodes


def _write(cursor: Cursor, document: dict[str, Any], position: int) -> None:
    listed, details, nodes = job_rows(document, position)
    cursor.execute("DELETE FROM job_nodes WHERE job_id = ?", (document["id"],))
    for node in nodes:
        cursor.execute(f"INSERT INTO job_nodes ({', '.join(JOB_NODES_COLUMNS)}) "
                       f"VALUES ({', '.join('?' * len(JOB_NODES_COLUMNS))})", node)  # fmt: skip
    cursor.execute(
        "INSERT INTO job_details (id, document) VALUES (?, ?) "
        "ON CONFLICT (id) DO UPDATE SET document = excluded.document",
        details,
    )
    updates = ", ".join(f"{column} = excluded.{column}" for column in JOB_LIST_COLUMNS[1:])
    cursor.execute(
        f"INSERT INTO job_list ({', '.join(JOB_LIST_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(JOB_LIST_COLUMNS))}) "
        f"ON CONFLICT (id) DO UPDATE SET {updates}",
        listed,
    )


def _insert_checkpoint(
    cursor: Cursor, document: dict[str, Any], checkpoint: dict[str, Any], at: str, position: int
) -> None:
    cursor.execute(
        "INSERT INTO checkpoints (id, job_id, owner, name, node, size, step, train_loss, "
        "eval_loss, model, version, inference_ready, archive_size, sha256, created_at, "
        "position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO NOTHING",
        (
            checkpoint["id"], document["id"], document["owner"], checkpoint["name"],
            checkpoint.get("node"), checkpoint.get("size"), checkpoint.get("step"),
            checkpoint.get("train_loss"), checkpoint.get("eval_loss"), checkpoint.get("model"),
            checkpoint.get("version"), int(bool(checkpoint.get("inference_ready"))),
            checkpoint.get("archive_size"), checkpoint.get("sha256"), at, position,
        ),
    )  # fmt: skip
