"""Operational state beside the ledger: node heartbeats, which agent holds each node, and which
images each node's cache holds (as its agent last told, in a heartbeat)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ledger.database import Cursor, Database
from ledger.schema import create_schema

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS node_heartbeats (
        node_id TEXT PRIMARY KEY, last_seen TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS node_holders (
        node_id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, since TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS node_images (
        node_id TEXT PRIMARY KEY, images TEXT NOT NULL, updated_at TEXT NOT NULL)""",
]


@dataclass(frozen=True)
class Holder:
    """The agent that holds a node, since when, and when the node was last heard of."""

    agent_id: str
    since: str
    last_seen: str | None


class NodeTaken(Exception):
    """Another agent holds the node (it is alive, or was heard of too recently)."""

    def __init__(self, node_name: str, holder: Holder, timeout_s: float) -> None:
        self.holder = holder
        heard = holder.last_seen or holder.since
        super().__init__(
            f"node '{node_name}' is held by another agent (since {holder.since}, last heard of "
            f"at {heard}); only one agent may run a node's jobs. Give this agent another "
            f"--name, or stop the other one (a silent node is released {timeout_s:g} s after "
            "its last heartbeat)"
        )


def now() -> datetime:
    return datetime.now(UTC)


class OperationalState:
    def __init__(self, database: Database) -> None:
        self.database = database
        with database.transaction(write=True) as cursor:
            create_schema(cursor, SCHEMA)

    def heartbeat(self, node_id: str, images: Sequence[tuple[str, str]] | None = None) -> None:
        """The node is alive; ``images``: the ``(reference, digest)`` of each image it holds
        now (None: as it last said)."""
        moment = now()
        with self.database.transaction(write=True) as cursor:
            self._beat(cursor, node_id, moment)
            if images is not None:
                cursor.execute(
                    "INSERT INTO node_images (node_id, images, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (node_id) DO UPDATE SET images = excluded.images, "
                    "updated_at = excluded.updated_at",
                    (node_id, json.dumps(sorted(map(list, images))), moment.isoformat()),
                )  # fmt: skip

    def image_rows(self) -> list[tuple[str, str, str, str]]:
        """Each image each node holds: ``(node_id, reference, digest, when the node said so)``,
        the latest said first."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT node_id, images, updated_at FROM node_images "
                           "ORDER BY updated_at DESC, node_id")  # fmt: skip
            return [(str(row["node_id"]), str(ref), str(digest), str(row["updated_at"]))
                    for row in cursor.fetchall()
                    for ref, digest in json.loads(row["images"])]  # fmt: skip

    def images(self) -> dict[str, dict[str, str]]:
        """Per node, the images it holds: each one's digest by its reference."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT node_id, images FROM node_images")
            return {str(row["node_id"]): {str(ref): str(digest)
                                          for ref, digest in json.loads(row["images"])}
                    for row in cursor.fetchall()}  # fmt: skip

    @staticmethod
    def _beat(cursor: Cursor, node_id: str, moment: datetime) -> None:
        cursor.execute(
            "INSERT INTO node_heartbeats (node_id, last_seen) VALUES (?, ?) "
            "ON CONFLICT (node_id) DO UPDATE SET last_seen = excluded.last_seen",
            (node_id, moment.isoformat()),
        )

    def claim_node(self, node_id: str, node_name: str, agent_id: str, timeout_s: float) -> None:
        """Let ``agent_id`` hold the node unless another agent holds it and is alive; mark the
        node alive. Raises :class:`NodeTaken` otherwise."""
        moment = now()
        stale = (moment - timedelta(seconds=timeout_s)).isoformat()
        with self.database.transaction(write=True) as cursor:
            # Insert first, so that two agents claiming a new node meet on its row's lock.
            cursor.execute(
                "INSERT INTO node_holders (node_id, agent_id, since) VALUES (?, ?, ?) "
                "ON CONFLICT (node_id) DO NOTHING",
                (node_id, agent_id, moment.isoformat()),
            )
            holder = self._holder(cursor, node_id, lock=True)
            if holder is not None and holder.agent_id != agent_id:
                if holder.last_seen is not None and holder.last_seen >= stale:
                    raise NodeTaken(node_name, holder, timeout_s)
                cursor.execute(
                    "UPDATE node_holders SET agent_id = ?, since = ? WHERE node_id = ?",
                    (agent_id, moment.isoformat(), node_id),
                )
            self._beat(cursor, node_id, moment)

    def leave(self, node_id: str, agent_id: str) -> None:
        """The node's agent ``agent_id`` stops: the node is no longer live (it takes no new
        job), and the next agent to register it holds it at once, with no lease to wait out."""
        with self.database.transaction(write=True) as cursor:
            cursor.execute("DELETE FROM node_holders WHERE node_id = ? AND agent_id = ?",
                           (node_id, agent_id))  # fmt: skip
            cursor.execute("DELETE FROM node_heartbeats WHERE node_id = ?", (node_id,))
            cursor.execute("DELETE FROM node_images WHERE node_id = ?", (node_id,))

    def holder(self, node_id: str) -> Holder | None:
        with self.database.transaction() as cursor:
            return self._holder(cursor, node_id, lock=False)

    def _holder(self, cursor: Cursor, node_id: str, *, lock: bool) -> Holder | None:
        suffix = " FOR UPDATE OF h" if lock and self.database.dialect == "postgres" else ""
        cursor.execute(
            "SELECT h.agent_id, h.since, b.last_seen FROM node_holders h "
            f"LEFT JOIN node_heartbeats b ON b.node_id = h.node_id WHERE h.node_id = ?{suffix}",
            (node_id,),
        )
        row = cursor.fetchone()
        if row is None:
            return None
        return Holder(str(row["agent_id"]), str(row["since"]), row["last_seen"])

    def last_seen(self) -> dict[str, str]:
        """When each node was last heard of (ISO 8601, UTC)."""
        with self.database.transaction() as cursor:
            cursor.execute("SELECT node_id, last_seen FROM node_heartbeats")
            return {str(row["node_id"]): str(row["last_seen"]) for row in cursor.fetchall()}

    def live_nodes(self, timeout_s: float) -> set[str]:
        since = (now() - timedelta(seconds=timeout_s)).isoformat()
        with self.database.transaction() as cursor:
            cursor.execute("SELECT node_id FROM node_heartbeats WHERE last_seen >= ?", (since,))
            return {str(row["node_id"]) for row in cursor.fetchall()}
