"""Each server process's presence (each store): seen alive by other servers while it runs, and
free the moment its process is killed with -9, so that the debug sessions it relayed can be
closed by another."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from api.debug.presence import LOCK_CLASS, FilePresence
from api.services import Services, build_services
from api.settings import Settings
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys
from pathlib import Path
from api.services import build_services
from api.settings import Settings

services = build_services(Settings(data_dir=Path(sys.argv[1]), database_url=sys.argv[2]))
services.presence.hold()
print(services.presence.instance_id, flush=True)
sys.stdin.read()
"""


class ServerProcess:
    """Another server process's services, holding its presence until killed."""

    def __init__(self, data_dir: Path, database_url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(data_dir), database_url], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.instance_id = self.process.stdout.readline().strip()
        assert self.instance_id, "the server process did not hold its presence"

    def kill_9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    opened = build_services(Settings(data_dir=tmp_path / "data", database_url=database_url))
    opened.presence.hold()
    yield opened
    opened.close()


@pytest.fixture
def server_process(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "other", database_url)
    yield server
    if server.process.poll() is None:
        server.kill_9()


def test_a_live_server_is_alive_and_one_killed_with_9_is_not_at_once(
    services: Services, server_process: ServerProcess
) -> None:
    me, other = services.presence.instance_id, server_process.instance_id
    never = "f" * 32
    assert me != other
    assert services.presence.alive([me, other, never]) == {me, other}
    server_process.kill_9()
    # PostgreSQL ends the killed server's session (and its lock) as soon as it reads the
    # closed socket: a moment, not a timeout.
    wait_until(lambda: services.presence.alive([me, other]) == {me}, timeout=5)


def test_a_server_that_stops_is_no_longer_alive(database_url: str, tmp_path: Path) -> None:
    first = build_services(Settings(data_dir=tmp_path / "one", database_url=database_url))
    second = build_services(Settings(data_dir=tmp_path / "two", database_url=database_url))
    try:
        first.presence.hold()
        second.presence.hold()
        assert second.presence.alive([first.presence.instance_id]) == {first.presence.instance_id}
        first.close()
        assert second.presence.alive([first.presence.instance_id]) == set()
    finally:
        second.close()


def test_on_postgresql_a_server_whose_connection_broke_is_alive_again_within_seconds(
    postgres_url: str, tmp_path: Path
) -> None:
    server = build_services(Settings(data_dir=tmp_path / "one", database_url=postgres_url))
    other = build_services(Settings(data_dir=tmp_path / "two", database_url=postgres_url))
    try:
        server.presence.hold()
        me = server.presence.instance_id
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE locktype = "
                "'advisory' AND classid::bigint = %s AND pid <> pg_backend_pid() AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (LOCK_CLASS,),
            )
        assert other.presence.alive([me]) == set()
        wait_until(lambda: other.presence.alive([me]) == {me}, timeout=5)
    finally:
        server.close()
        other.close()


def test_on_sqlite_a_dead_servers_file_is_removed_and_odd_names_are_never_alive(
    tmp_path: Path, server_process_sqlite: ServerProcess
) -> None:
    servers = tmp_path / "flexai.sqlite3.servers"
    presence = FilePresence(servers)
    presence.hold()
    dead = server_process_sqlite.instance_id
    assert (servers / f"{dead}.lock").exists()
    server_process_sqlite.kill_9()
    outside = tmp_path / "not-a-presence.lock"
    outside.write_text("")
    assert presence.alive([dead, "../not-a-presence", str(outside)]) == set()
    assert not (servers / f"{dead}.lock").exists()  # a dead server's file goes
    assert outside.exists()  # a relay that is no instance id names no file of ours
    presence.release()
    assert list(servers.iterdir()) == []


@pytest.fixture
def server_process_sqlite(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "other", f"sqlite:///{tmp_path / 'flexai.sqlite3'}")
    yield server
    if server.process.poll() is None:
        server.kill_9()
