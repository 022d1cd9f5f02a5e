"""Keeps the views up to date with the ledger, applying each event exactly once.

Each batch read from the ledger is folded together (:mod:`projections.live_fold`: each job's
rows written once) and commits with the new tracking position in one transaction; a replica
that races another re-reads the position under the row lock and skips what is already applied.

An event that cannot be applied (a view rejects its values, its type is unknown, a folding bug)
halts the projection loudly rather than being skipped or retried in a tight loop: the events
before it stay applied, :attr:`Projector.halted` names it, and every later ``catch_up`` raises
:class:`ProjectionHalted` until the server is restarted with a fix (or told to skip that event
with ``skip``). A database that is away for a moment is not such a failure: the next round
retries.

Events other replicas write are followed in a background thread (:meth:`Projector.start`): on
PostgreSQL as soon as ``NOTIFY flexai_ledger`` tells of them (:meth:`Projector.follow_by`), with
a slow poll as a safety net; on SQLite by polling.

What the views are known to hold costs nothing to ask again: a :meth:`Projector.wait` for a
position this process has applied or heard of already returns at once, and a notification of
a position the views hold already (this server's own writes, which the writing request applied)
wakes no catch-up. A catch-up that found less than a batch stops there rather than read the
ledger once more to find it empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from eventsourcing.application import Application

from ledger.database import Cursor, Database, is_unavailable
from projections.live_fold import apply_batch
from projections.views import VIEW_TABLES, VIEWS_VERSION, apply_event, create_tables

log = logging.getLogger(__name__)
BATCH = 200
STOP_SLICE_S = 0.25
"""The longest a follower waiting for a notification takes to see that it is to stop."""

Listener = Callable[[Sequence[Any]], None]
"""Told of each batch of domain events once it is committed to the views, by this process or
by another replica sharing them (each event once per process, in ledger order)."""


class Notifications(Protocol):
    """Tells of commits to the ledger (see :class:`ledger.database.LedgerListener`)."""

    told: int | None
    """The last ledger position the notifications taken by the last ``wait`` named; None when
    one named none, or listening (re)started: then every commit is to be looked for."""

    def wait(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


class ProjectionTimeout(Exception):
    pass


@dataclass(frozen=True)
class Poison:
    """The event a projection could not apply, and why."""

    position: int
    topic: str
    originator_id: str
    originator_version: int
    error: str
    at: str

    def describe(self) -> str:
        return (
            f"ledger position {self.position} ({self.topic} of {self.originator_id}, version "
            f"{self.originator_version}): {self.error}"
        )


class ProjectionHalted(Exception):
    def __init__(self, poison: Poison) -> None:
        self.poison = poison
        super().__init__(f"the views stopped at an event they cannot apply: {poison.describe()}")


class _PoisonFound(Exception):
    def __init__(self, index: int, poison: Poison) -> None:
        self.index = index
        self.poison = poison


class Projector:
    def __init__(
        self,
        app: Application[Any],
        database: Database,
        name: str = "views",
        *,
        skip: Collection[int] = (),
        batch: int = BATCH,
    ) -> None:
        self.app = app
        self.database = database
        self.name = name
        self.skip = frozenset(skip)
        self.batch = batch
        """Events read from the ledger, and applied together, at once."""
        self.halted: Poison | None = None
        self.listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notifications: Notifications | None = None
        self._poll_s = 1.0
        self.followed: list[Callable[[], None]] = []
        """Called when the background follower found events (written by another replica)."""
        self._heard: int | None = None
        """The last ledger position whose event this process told its listeners of."""
        self._known = 0
        """A ledger position the views hold, and whose events (and all before) this process's
        listeners were told of: a wait for it, or for one before it, is over at once."""
        with database.transaction(write=True) as cursor:
            self._rebuild_if_reshaped(cursor)
            create_tables(cursor)
            cursor.execute(
                "INSERT INTO projection_tracking (name, position) VALUES (?, 0) "
                "ON CONFLICT (name) DO NOTHING",
                (name,),
            )

    def _rebuild_if_reshaped(self, cursor: Cursor) -> None:
        """Views written by an older shape are dropped, to be rebuilt from the first event."""
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS view_schema ("
            "name TEXT PRIMARY KEY, version BIGINT NOT NULL)"
        )
        cursor.execute("SELECT version FROM view_schema WHERE name = ?", (self.name,))
        row = cursor.fetchone()
        if row is not None and int(row["version"]) == VIEWS_VERSION:
            return
        if row is not None or self._has_tracking(cursor):
            log.warning("views: their shape changed (version %s); rebuilding them from the "
                        "ledger", VIEWS_VERSION)  # fmt: skip
        for table in VIEW_TABLES:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS projection_tracking ("
            "name TEXT PRIMARY KEY, position BIGINT NOT NULL)"
        )
        cursor.execute("DELETE FROM projection_tracking WHERE name = ?", (self.name,))
        cursor.execute(
            "INSERT INTO view_schema (name, version) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET version = excluded.version",
            (self.name, VIEWS_VERSION),
        )

    def _has_tracking(self, cursor: Cursor) -> bool:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS projection_tracking ("
            "name TEXT PRIMARY KEY, position BIGINT NOT NULL)"
        )
        cursor.execute("SELECT position FROM projection_tracking WHERE name = ?", (self.name,))
        return cursor.fetchone() is not None

    @contextmanager
    def held(self) -> Iterator[None]:
        """No catch-up of these views in this process meanwhile (a rebuild swaps them)."""
        with self._lock:
            yield

    @property
    def heard(self) -> int:
        """The last ledger position whose event this process told (or is telling) its
        listeners of; 0 before the first catch-up."""
        return self._heard or 0

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

    def catch_up(self, until: int | None = None) -> int:
        """Apply every event recorded after the tracked position; return the new position.
        With ``until``, return at once (the position known here) if, by the time this call
        holds the lock, another call applied or heard of the event at ``until``: the
        submissions that one group commit saved wait for the same catch-up.

        Raises :class:`ProjectionHalted` once an event could not be applied.
        """
        with self._lock:
            if self.halted is not None:
                raise ProjectionHalted(self.halted)
            if until is not None and until <= self._known:
                return self._known
            position = self.position()
            self._hear_until(position)  # what other replicas applied to the shared views
            while True:
                notifications = self.app.recorder.select_notifications(
                    start=position + 1, limit=self.batch
                )
                if not notifications:
                    return position
                try:
                    position = self._apply_batch(notifications, folded=True)
                except Exception as error:
                    if is_unavailable(error):
                        raise
                    position = self._apply_singly(notifications, error)
                if len(notifications) < self.batch:
                    return position  # the ledger's end when read: later commits call again

    def _apply_singly(self, notifications: Sequence[Any], error: Exception) -> int:
        """Apply event by event a batch that failed folded, to halt at the event at fault."""
        log.warning("views: a batch failed folded (%s); applying it event by event", error)
        try:
            return self._apply_batch(notifications, folded=False)
        except _PoisonFound as found:
            self._apply_batch(notifications[: found.index], folded=False)
            self._halt(found.poison)
            raise ProjectionHalted(found.poison) from None

    def _apply_batch(self, notifications: Sequence[Any], *, folded: bool) -> int:
        """Apply a batch with the tracking position: ``folded`` together, else one by one."""
        applied: dict[int, Any] = {}
        with self.database.transaction(write=True) as cursor:
            position = self._read_position(cursor, lock=True)
            for index, notification in enumerate(notifications):
                if notification.id <= position:
                    continue
                if notification.id in self.skip:
                    log.warning("views: skipping ledger position %d as told", notification.id)
                elif folded:
                    applied[notification.id] = self.app.mapper.to_domain_event(notification)
                else:
                    applied[notification.id] = self._apply_one(cursor, index, notification)
                position = notification.id
            if folded:
                apply_batch(cursor, applied)
            cursor.execute(
                "UPDATE projection_tracking SET position = ? WHERE name = ?",
                (position, self.name),
            )
        self._hear_until(position, notifications, applied)
        return position

    def _hear_until(
        self, position: int, fetched: Sequence[Any] = (), applied: Mapping[int, Any] = {}
    ) -> None:
        """Tell the listeners, in order and once each in this process, of every event up to
        ``position``: those this process applied (``applied``, from ``fetched``) and those
        another replica applied to the views they share, which this process must hear of all
        the same (its followers and waiting agents are its own)."""
        heard = self._heard
        if heard is None:  # the first catch-up: nobody here waits on the events before it
            self._heard = self._known = position
            return
        if position <= heard:
            return
        # ``fetched`` holds every notification between its first and its last; the rest of
        # the range is read (a replica that applied them first took them off this one).
        first, last = (fetched[0].id, fetched[-1].id) if fetched else (position + 1, position)
        notifications = [*self._notifications_between(heard, min(first - 1, position)),
                         *(n for n in fetched if heard < n.id <= position),
                         *self._notifications_between(max(heard, last), position)]  # fmt: skip
        events = []
        for notification in notifications:
            if notification.id in self.skip:
                continue
            domain_event = applied.get(notification.id)
            if domain_event is None:
                try:
                    domain_event = self.app.mapper.to_domain_event(notification)
                except Exception as error:  # the views passed over it; so do the listeners
                    log.warning("views: listeners not told of ledger position %d: %s",
                                notification.id, error)  # fmt: skip
                    continue
            events.append(domain_event)
        self._heard = position
        if events:
            self._tell(events)
        self._known = max(self._known, position)

    def _notifications_between(self, after: int, last: int) -> list[Any]:
        """The ledger's notifications from ``after`` (excluded) to ``last`` (included)."""
        found: list[Any] = []
        while after < last:
            batch = self.app.recorder.select_notifications(start=after + 1, limit=BATCH,
                                                           stop=last)  # fmt: skip
            if not batch:
                break
            found += batch
            after = batch[-1].id
        return found

    def _apply_one(self, cursor: Cursor, index: int, notification: Any) -> Any:
        try:
            domain_event = self.app.mapper.to_domain_event(notification)
            apply_event(cursor, domain_event, notification.id)
        except Exception as error:
            if is_unavailable(error):
                raise
            raise _PoisonFound(index, _poison(notification, error)) from error
        return domain_event

    def _halt(self, poison: Poison) -> None:
        self.halted = poison
        log.critical(
            "views halted at %s; writes are refused until the server restarts with a fix, or "
            "with --skip-event %d to pass over it",
            poison.describe(), poison.position,
        )  # fmt: skip

    def _tell(self, applied: Sequence[Any]) -> None:
        for listener in self.listeners:
            try:
                listener(applied)
            except Exception:  # a listener's bug must not hold the views back
                log.exception("a views listener failed")

    def wait(self, position: int | None, timeout: float = 10.0) -> None:
        """Read-your-writes: return once the views hold the event at ``position`` (at once,
        without a look at the database, when this process applied or heard of it already)."""
        if position is None or (position <= self._known and self.halted is None):
            return
        deadline = time.monotonic() + timeout
        while self.catch_up(until=position) < position:
            if time.monotonic() > deadline:
                raise ProjectionTimeout(f"views did not reach ledger position {position}")
            time.sleep(0.01)

    def follow_by(self, notifications: Notifications, poll_s: float = 1.0) -> None:
        """Follow the ledger by ``notifications`` (PostgreSQL's LISTEN) once started: catch up
        as soon as one comes, and every ``poll_s`` seconds anyway, as a safety net."""
        self._notifications = notifications
        self._poll_s = poll_s

    def start(self, interval: float = 0.25) -> None:
        """Follow events written elsewhere (other replicas) in a background thread: when told
        of them (see :meth:`follow_by`), else by reading the ledger every ``interval`` s."""
        self._thread = threading.Thread(
            target=self._follow, args=(interval,), name="projector", daemon=True
        )
        self._thread.start()

    def _follow(self, interval: float) -> None:
        notifications = self._notifications
        try:
            while not self._stop.is_set():
                if notifications is None:
                    if self._stop.wait(interval):
                        return
                else:
                    woken = self._await(notifications)
                    if self._stop.is_set():
                        return
                    told = notifications.told if woken else None
                    if told is not None and told <= self._known:
                        continue  # held already: this server's own writes, applied as made
                self._follow_once()
        finally:
            if notifications is not None:
                notifications.close()

    def _await(self, notifications: Notifications) -> bool:
        """Until a notification (True), ``poll_s`` passed, or ``stop`` (in slices, so that
        stopping never waits for a whole poll)."""
        deadline = time.monotonic() + self._poll_s
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if notifications.wait(min(left, STOP_SLICE_S)):
                return True
        return False

    def _follow_once(self) -> None:
        try:
            before = self._heard
            self.catch_up()
            if self._heard != before:
                for hook in self.followed:
                    hook()
        except ProjectionHalted:
            pass  # said loudly once; health and metrics keep saying it
        except Exception as error:  # keep following; the next round retries
            if is_unavailable(error):
                log.warning("projection catch-up waits for the database: %s", error)
            else:
                log.exception("projection catch-up failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _poison(notification: Any, error: Exception) -> Poison:
    reason = " ".join(f"{type(error).__name__}: {error}".split())
    return Poison(
        position=int(notification.id),
        topic=str(notification.topic).rpartition(":")[2] or str(notification.topic),
        originator_id=str(notification.originator_id),
        originator_version=int(notification.originator_version),
        error=reason[:500],
        at=datetime.now(UTC).isoformat(),
    )
