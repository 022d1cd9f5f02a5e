"""The bulk seeder (:mod:`bench.seed`) on each store: what it writes is a ledger that
`admin verify` finds sound, its hash chain included, and views that a rebuild from that ledger
gives again; commands go on from it as from any ledger."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
from pydantic import SecretStr

from api.ledger.verify import verify_ledger
from api.services import Services, build_services
from api.settings import Settings
from bench.seed import job_name, seed_jobs
from domain.actors import user
from domain.errors import DomainError, NameTaken
from projections import bulk
from tests.integration.conftest import job_spec
from tests.integration.test_ledger_format import new_key, open_services, raw_states
from tests.integration.test_rebuild_views import dump, workload

JOBS = 2000


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    opened = build_services(Settings(data_dir=tmp_path, database_url=database_url))
    yield opened
    opened.close()


def head(services: Services) -> int:
    return services.jobs.recorder.max_notification_id() or 0  # type: ignore[attr-defined]


def test_a_seeded_ledger_verifies_and_a_rebuild_gives_the_same_views(services: Services) -> None:
    position = services.jobs.submit("admin", "by-command", job_spec(), by=user("admin")).position
    assert position is not None
    services.projector.catch_up()
    seeded = seed_jobs(services.jobs, services.database, JOBS, batch_size=700)
    assert seeded.first_position == position + 1
    assert seeded.last_position == head(services) == seeded.events + position
    assert seeded.events == JOBS * 4 + JOBS // 10  # a tenth were stopped: one event more
    assert services.projector.catch_up() == head(services)  # the views were moved with it
    seeded_views = dump(services)
    assert len(seeded_views["job_list"]) == JOBS + 1
    statuses = [row for row in seeded_views["job_list"] if ("status", "stopped") in row]
    assert len(statuses) == JOBS // 10

    report = verify_ledger(services.ledger_parts(), artifacts="none")
    assert report["ledger_problems"] == [] and report["view_differences"] == []
    assert report["chained"] == report["events"] == head(services)
    assert report["jobs"] == JOBS + 1 and report["ok"]

    assert services.rebuilder is not None
    progress = services.rebuilder.run()
    assert progress.state == "done", progress.error
    assert dump(services) == seeded_views


def test_commands_go_on_from_a_seeded_ledger(services: Services) -> None:
    seed_jobs(services.jobs, services.database, 30)
    with pytest.raises(NameTaken):  # the seeded claims hold their names
        services.jobs.submit("admin", job_name(7), job_spec(), by=user("admin"))
    job_id = services.jobs.submit("admin", "after-seeding", job_spec(), by=user("admin")).job_id
    services.jobs.request_stop(job_id, by=user("admin"))
    services.projector.catch_up()
    shown = services.queries.job_by_name("admin", job_name(7))
    assert shown is not None and shown["status"] == "rejected"
    assert [entry["event"] for entry in shown["history"]] == ["Submitted", "SchedulingStarted",
                                                              "Rejected"]  # fmt: skip
    seed_jobs(services.jobs, services.database, 5, names="more-{}")
    report = verify_ledger(services.ledger_parts(), artifacts="none")
    assert report["ok"], report
    assert report["jobs"] == 36


def test_a_rebuild_holding_few_jobs_in_memory_gives_the_same_views(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``MAX_DOCUMENTS`` jobs the bulk fold writes their rows and reads a job back when
    another of its events comes: the views come out the same."""
    workload(services, jobs=40)
    seed_jobs(services.jobs, services.database, 50)
    for row in services.queries.list_jobs("alice")[::3]:  # later events of early jobs
        with contextlib.suppress(DomainError):  # one that has not ended yet
            services.jobs.delete(UUID(row["id"]), by=user("alice"))
    services.projector.catch_up()
    before = dump(services)
    monkeypatch.setattr(bulk, "MAX_DOCUMENTS", 3)
    assert services.rebuilder is not None
    progress = services.rebuilder.run()
    assert progress.state == "done", progress.error
    assert dump(services) == before


def test_an_encrypted_compressed_ledger_is_seeded_as_its_commands_write(
    database_url: str, tmp_path: Path
) -> None:
    """Its batches are made beside the writer (the cipher stays in the process): the events
    are stored encrypted, and `admin verify` and a rebuild read them as the commands' own."""
    services = open_services(tmp_path, database_url, ledger_key=SecretStr(new_key()),
                             compress_events=True)  # fmt: skip
    try:
        seed_jobs(services.jobs, services.database, 300, batch_size=120)
        assert not any(job_name(7).encode() in state for state in raw_states(database_url))
        shown = services.queries.job_by_name("admin", job_name(7))
        assert shown is not None and shown["status"] == "rejected"
        seeded_views = dump(services)
        report = verify_ledger(services.ledger_parts(), artifacts="none")
        assert report["ok"] and report["jobs"] == 300, report
        assert services.rebuilder is not None
        progress = services.rebuilder.run()
        assert progress.state == "done", progress.error
        assert dump(services) == seeded_views
    finally:
        services.close()


SEEDING = """
import sys
from api.settings import Settings
from domain.application import TrainingJobs
from ledger.database import open_database
from bench.seed import seed_jobs

def seed():
    settings = Settings(data_dir=sys.argv[1])
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = TrainingJobs(env=settings.event_store_env())
    print("seeded", seed_jobs(app, open_database(settings.resolved_database_url), 30,
                              batch_size=10).jobs)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_script_that_seeds_sqlite_past_a_batch_must_start_under_a_main_guard(
    tmp_path: Path, guarded: bool
) -> None:
    """Past one batch on SQLite the batches are made in a spawned process, which imports the
    script: unguarded, the script is told what to do, not only that a process broke."""
    start = 'if __name__ == "__main__":\n    seed()\n' if guarded else "seed()\n"
    script = tmp_path / "seeding.py"
    script.write_text(SEEDING + start)
    root = Path(__file__).resolve().parents[2]
    ran = subprocess.run([sys.executable, str(script), str(tmp_path / "data")], cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    if guarded:
        assert ran.returncode == 0 and "seeded 30" in ran.stdout, ran.stderr
    else:
        assert ran.returncode != 0
        told = ("RuntimeError: the process that makes the seeder's batches ended without one",
                "a script that seeds must start under `if __name__ == \"__main__\":`")
        assert all(part in ran.stderr for part in told), ran.stderr
