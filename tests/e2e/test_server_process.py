"""`flexai server` as an operator meets it: start-up errors and a clean stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import start_cluster
from tests.pg import POSTGRES_ADMIN_URL

pytestmark = pytest.mark.e2e


def test_a_database_that_does_not_exist_is_named_in_one_line(tmp_path: Path) -> None:
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/flexai_no_such_database"
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "server", "--data-dir", str(tmp_path),
         "--database-url", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert 'database "flexai_no_such_database" does not exist' in result.stderr
    assert "--database-url" in result.stderr


def test_server_and_agent_stop_cleanly_on_sigterm_and_the_ledger_survives(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "first", database_url=None)
    try:
        token = json.loads((cluster.root / "config.json").read_text())["token"]
    finally:
        for process in reversed(cluster.processes):
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=20) for process in cluster.processes]
    assert codes == [0, 0]
    assert "flexai server stopped" in cluster.log("server")

    again = start_cluster(tmp_path / "first", database_url=None)
    try:
        nodes = again.api("GET", "/v1/nodes").json()["nodes"]
        assert [node["name"] for node in nodes] == ["test-node"]
        assert json.loads((again.root / "config.json").read_text())["token"] == token
    finally:
        again.stop()
