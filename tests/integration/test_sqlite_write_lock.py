"""One SQLite file's writers in one process (the views' transactions and the ledger's group
commits) queue on one lock of this process (:func:`ledger.database.sqlite_write_lock`), not in
SQLite's busy timeout, which sleeps up to 100 ms between tries while the file is locked.

SQLite only: PostgreSQL has no file lock to wait for (its own lock queue wakes the next writer).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from api.settings import Settings
from domain.actors import user
from domain.application import TrainingJobs
from ledger import database as db
from ledger.database import SQLiteDatabase, sqlite_write_lock
from tests.integration.conftest import job_spec
from tests.support import wait_until


def test_one_file_has_one_write_lock_however_its_path_is_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "flexai.sqlite3"
    (tmp_path / "elsewhere").symlink_to(tmp_path)
    monkeypatch.chdir(tmp_path)
    lock = sqlite_write_lock(str(path))
    assert sqlite_write_lock("flexai.sqlite3") is lock
    assert sqlite_write_lock(str(tmp_path / "elsewhere" / "flexai.sqlite3")) is lock
    assert sqlite_write_lock(str(tmp_path / "other.sqlite3")) is not lock
    assert sqlite_write_lock(":memory:") is not sqlite_write_lock(":memory:")  # private ones


def _waits_for_the_lock(thread: threading.Thread) -> bool:
    """Whether ``thread`` is in the lock's ``__enter__`` (its code, not its locals: another
    thread's live frame is only read)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_qualname == db.SQLiteWriteLock.__enter__.__qualname__:
            return True
        frame = frame.f_back
    return False


def test_a_ledger_save_queues_behind_the_views_write_and_goes_once_it_commits(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path)
    app = TrainingJobs(env=settings.event_store_env())
    views = SQLiteDatabase(str(tmp_path / "flexai.sqlite3"))
    assert os.path.samefile(views.path, app.recorder.datastore.pool.db_name)  # type: ignore[attr-defined]
    saved: list[object] = []
    saving = threading.Thread(target=lambda: saved.append(
        app.submit("alice", "resnet-50", job_spec(), by=user("alice"))))  # fmt: skip
    try:
        with views.transaction(write=True) as cursor:
            cursor.execute("CREATE TABLE held (n INTEGER)")
            saving.start()
            wait_until(lambda: _waits_for_the_lock(saving), timeout=10)
            assert not saved  # it queues in this process, not in SQLite's sleeps
        saving.join(10)
        assert saved and not saving.is_alive()
        with views.transaction() as cursor:
            cursor.execute("SELECT COUNT(*) AS n FROM held")
            assert cursor.fetchone() == {"n": 0}
    finally:
        if saving.ident is not None:
            saving.join(60)  # its connection is not closed under it
        views.close()
        app.close()


def test_a_writer_that_waits_past_the_busy_timeout_fails_as_sqlite_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "SQLITE_BUSY_S", 0.2)
    views = SQLiteDatabase(str(tmp_path / "flexai.sqlite3"))
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with views.transaction(write=True):
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with (
            pytest.raises(sqlite3.OperationalError, match="database is locked"),
            views.transaction(write=True),
        ):
            pass
    finally:
        done.set()
        holder.join(10)
    with views.transaction(write=True) as cursor:  # free again
        cursor.execute("SELECT 1")
    views.close()
