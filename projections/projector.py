"""Keeps the views up to date with the ledger, applying each event exactly once.

The view changes and the new tracking position commit in one transaction; a replica that
races another re-reads the position under the row lock and skips what is already applied.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from eventsourcing.application import Application

from projections.db import Cursor, Database
from projections.views import apply_event, create_tables

log = logging.getLogger(__name__)
BATCH = 200


class ProjectionTimeout(Exception):
    pass


class Projector:
    def __init__(self, app: Application[Any], database: Database, name: str = "views") -> None:
        self.app = app
        self.database = database
        self.name = name
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        with database.transaction(write=True) as cursor:
            create_tables(cursor)
            cursor.execute(
                "INSERT INTO projection_tracking (name, position) VALUES (?, 0) "
                "ON CONFLICT (name) DO NOTHING",
                (name,),
            )

    def position(self) -> int:
        with self.database.transaction() as cursor:
            return self._read_position(cursor, lock=False)

    def _read_position(self, cursor: Cursor, *, lock: bool) -> int:
        suffix = " FOR UPDATE" if lock and self.database.dialect == "postgres" else ""
        cursor.execute(
            f"SELECT position FROM projection_tracking WHERE name = ?{suffix}", (self.name,)
        )
        row = cursor.fetchone()
        return int(row["position"]) if row else 0

    def catch_up(self) -> int:
        """Apply every event recorded after the tracked position; return the new position."""
        with self._lock:
            position = self.position()
            while True:
                notifications = self.app.recorder.select_notifications(
                    start=position + 1, limit=BATCH
                )
                if not notifications:
                    return position
                position = self._apply_batch(notifications)

    def _apply_batch(self, notifications: Any) -> int:
        with self.database.transaction(write=True) as cursor:
            position = self._read_position(cursor, lock=True)
            for notification in notifications:
                if notification.id <= position:
                    continue
                domain_event = self.app.mapper.to_domain_event(notification)
                apply_event(cursor, domain_event, notification.id)
                position = notification.id
            cursor.execute(
                "UPDATE projection_tracking SET position = ? WHERE name = ?",
                (position, self.name),
            )
        return position

    def wait(self, position: int | None, timeout: float = 10.0) -> None:
        """Read-your-writes: return once the views hold the event at ``position``."""
        if position is None:
            return
        deadline = time.monotonic() + timeout
        while self.catch_up() < position:
            if time.monotonic() > deadline:
                raise ProjectionTimeout(f"views did not reach ledger position {position}")
            time.sleep(0.01)

    def start(self, interval: float = 0.25) -> None:
        """Follow events written elsewhere (other replicas) in a background thread."""
        self._thread = threading.Thread(
            target=self._follow, args=(interval,), name="projector", daemon=True
        )
        self._thread.start()

    def _follow(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.catch_up()
            except Exception:  # keep following; the next round retries
                log.exception("projection catch-up failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
