"""A batch of ledger events applied to the views at once, as the live projector catches up.

Applied one at a time, each job event costs a read of the job's document and three writes of
its rows. Folded as a batch, the documents of the jobs the batch touches are read in one query,
every event is folded in memory (:func:`projections.views.fold_job_event`, the code the
per-event path and a rebuild use), and each touched job's rows are written once, with
``executemany``. The rows are those the per-event path would leave: each job's as of its last
event in the batch. Events other than a job's (nodes, datasets) and a job's checkpoint and
debug session rows are few and apply one by one, in ledger order, as they fold.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from domain.events import event_name
from domain.job_attempts import is_job_event
from ledger.database import Cursor
from projections.views import (
    JOB_DETAILS_COLUMNS,
    JOB_LIST_COLUMNS,
    JOB_NODES_COLUMNS,
    apply_event,
    fold_job_event,
    job_rows,
)

IDS_AT_ONCE = 500
"""Job ids named in one ``IN (...)`` list (well under SQLite's limit on parameters)."""


class BatchCursor(Cursor, Protocol):
    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None: ...


def _upsert(table: str, columns: Sequence[str]) -> str:
    updates = ", ".join(f"{column} = excluded.{column}" for column in columns[1:])
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT ({columns[0]}) DO UPDATE SET {updates}")  # fmt: skip


UPSERT_JOB_LIST = _upsert("job_list", JOB_LIST_COLUMNS)
UPSERT_JOB_DETAILS = _upsert("job_details", JOB_DETAILS_COLUMNS)
INSERT_JOB_NODES = (f"INSERT INTO job_nodes ({', '.join(JOB_NODES_COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(JOB_NODES_COLUMNS))})")  # fmt: skip


def apply_batch(cursor: BatchCursor, events: Mapping[int, Any]) -> None:
    """Change the views for ``events`` (ledger position to domain event, in ledger order),
    inside the caller's transaction."""
    documents = _read_documents(cursor, _jobs_to_read(events.values()))
    placed = [job_id for job_id, document in documents.items() if document.get("placements")]
    positions: dict[str, int] = {}  # each changed job's, of the last event that changed it
    for position, domain_event in events.items():
        if not _is_job_event(domain_event):
            apply_event(cursor, domain_event, position)
            continue
        job_id = str(domain_event.originator_id)
        document = fold_job_event(cursor, documents.get(job_id), domain_event, position)
        if document is not None:
            documents[job_id] = document
            positions[job_id] = position
    _write(cursor, documents, positions, placed)


def _is_job_event(domain_event: Any) -> bool:
    return is_job_event(domain_event)


def _jobs_to_read(events: Iterable[Any]) -> list[str]:
    """The jobs whose first event in the batch folds into the document the views hold (a
    ``Submitted`` starts a new one)."""
    seen: set[str] = set()
    to_read: list[str] = []
    for domain_event in events:
        if not _is_job_event(domain_event):
            continue
        job_id = str(domain_event.originator_id)
        if job_id not in seen:
            seen.add(job_id)
            if event_name(domain_event) != "Submitted":
                to_read.append(job_id)
    return to_read


def _read_documents(cursor: Cursor, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    documents: dict[str, dict[str, Any]] = {}
    for start in range(0, len(job_ids), IDS_AT_ONCE):
        chunk = job_ids[start : start + IDS_AT_ONCE]
        cursor.execute(f"SELECT id, document FROM job_details WHERE id IN "
                       f"({', '.join('?' * len(chunk))})", chunk)  # fmt: skip
        for row in cursor.fetchall():
            documents[str(row["id"])] = json.loads(row["document"])
    return documents


def _write(
    cursor: BatchCursor,
    documents: Mapping[str, dict[str, Any]],
    positions: Mapping[str, int],
    placed: Sequence[str],
) -> None:
    """Each changed job's rows, once: its placements replaced (only a job whose document
    had some has ``job_nodes`` rows; a ``Submitted`` is a job's first event), its list and
    details upserted, in the order the per-event path writes them."""
    if not positions:
        return
    job_ids = list(positions)
    rows = [job_rows(documents[job_id], positions[job_id]) for job_id in job_ids]
    for start in range(0, len(placed), IDS_AT_ONCE):
        chunk = placed[start : start + IDS_AT_ONCE]
        cursor.execute(f"DELETE FROM job_nodes WHERE job_id IN "
                       f"({', '.join('?' * len(chunk))})", chunk)  # fmt: skip
    nodes = [node for _, _, placed in rows for node in placed]
    if nodes:
        cursor.executemany(INSERT_JOB_NODES, nodes)
    cursor.executemany(UPSERT_JOB_DETAILS, [details for _, details, _ in rows])
    cursor.executemany(UPSERT_JOB_LIST, [listed for listed, _, _ in rows])
