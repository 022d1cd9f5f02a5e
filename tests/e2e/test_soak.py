"""The soak that ships with the product (``bench/soak.py``), short: 100 jobs with retries through
two replicas on PostgreSQL and SeaweedFS, to two agents, while one fault of each kind is
injected (``kill -9`` of a replica and of an agent, PostgreSQL away, the object store killed).
Every answered submission is in the ledger, every job ends and succeeds (no infrastructure
failure ends a job with retries left), `admin verify` passes, outputs fetch whole, and no part
logged a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT
from tests.e2e.test_replicas import _postgres_absent

pytestmark = pytest.mark.e2e


def test_a_short_soak_that_kills_every_part_loses_nothing_and_fails_no_job(
    tmp_path: Path,
) -> None:
    absent = _postgres_absent()
    if absent:
        pytest.skip(absent)
    report_file = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--jobs", "100", "--duration", "20",
         "--fault-every", "5", "--settle", "240", "--fetch-sample", "5", "--dir",
         str(tmp_path / "soak"), "--json", str(report_file)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    said = f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    assert report_file.exists(), said
    report = json.loads(report_file.read_text())
    kinds = [fault.split(" s ", 1)[1].split(":")[0] for fault in report["faults"]]
    assert kinds == ["replica", "agent", "postgres", "s3"], said
    assert report["lost_submissions"] == [], said
    assert report["not_terminal"] == [], said
    assert report["failed_with_retries_left"] == [], said
    assert report["verify_ok"], said
    assert report["statuses"] == {"succeeded": 100}, said
    assert report["outputs_checked"] == 5 and report["outputs_bad"] == [], said
    assert report["tracebacks"] == {}, said
    assert done.returncode == 0 and report["clean"], said
    assert "clean: yes" in done.stdout
