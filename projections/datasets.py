"""The datasets' view tables and how ``Dataset`` events change them.

``datasets`` holds one row per owner and name with its latest version; ``dataset_versions``
every version ever pushed, so that the version an older job got stays readable.
"""

from __future__ import annotations

from typing import Any

from ledger.database import Cursor

DATASET_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS datasets (
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL,
        version BIGINT NOT NULL, content_hash TEXT, size BIGINT, files BIGINT,
        created_at TEXT NOT NULL, pushed_at TEXT, pushed_by TEXT, position BIGINT NOT NULL)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS datasets_owner_name ON datasets (owner, name)",
    """CREATE TABLE IF NOT EXISTS dataset_versions (
        dataset_id TEXT NOT NULL, version BIGINT NOT NULL, content_hash TEXT NOT NULL,
        size BIGINT NOT NULL, files BIGINT NOT NULL, pushed_at TEXT NOT NULL,
        pushed_by TEXT NOT NULL, position BIGINT NOT NULL, PRIMARY KEY (dataset_id, version))""",
]


def apply_dataset_event(cursor: Cursor, domain_event: Any, position: int) -> None:
    """``Dataset.Created`` adds the dataset's row; ``Dataset.Pushed`` makes its version the
    latest and keeps it among the versions."""
    dataset_id = str(domain_event.originator_id)
    at = domain_event.timestamp.isoformat()
    kind = type(domain_event).__name__
    if kind == "Created":
        cursor.execute(
            "INSERT INTO datasets (id, owner, name, version, created_at, position) "
            "VALUES (?, ?, ?, 0, ?, ?) ON CONFLICT (id) DO NOTHING",
            (dataset_id, domain_event.owner, domain_event.name, at, position),
        )
    elif kind == "Pushed":
        facts = (domain_event.version, domain_event.content_hash, domain_event.size,
                 domain_event.files, at, str(domain_event.by.get("id")))  # fmt: skip
        cursor.execute(
            "UPDATE datasets SET version = ?, content_hash = ?, size = ?, files = ?, "
            "pushed_at = ?, pushed_by = ?, position = ? WHERE id = ?",
            (*facts, position, dataset_id),
        )
        cursor.execute(
            "INSERT INTO dataset_versions (dataset_id, version, content_hash, size, files, "
            "pushed_at, pushed_by, position) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (dataset_id, version) DO NOTHING",
            (dataset_id, *facts, position),
        )
