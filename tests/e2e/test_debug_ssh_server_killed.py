"""A debug session whose server is killed with -9 (each store): the real CLI and OpenSSH in a
real job, the server process killed, the job ending meanwhile; the server started again closes
the session in the ledger, and `inspect` and `history` say so."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.harness import FLEXAI, Cluster
from tests.support import wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client"),
]

TRAIN = """\
import os, pathlib, time

print("ready", flush=True)
while not pathlib.Path(os.environ["FINISH_FILE"]).exists():
    time.sleep(0.05)
print("finished", flush=True)
"""


def test_a_session_a_killed_server_left_open_is_closed_when_it_starts_again(
    cluster: Cluster,
    repo_factory: Callable[[dict[str, str]], Path],
    job_name: str,
    tmp_path: Path,
) -> None:
    finish = tmp_path / "finish"  # the job sees it (read-only, from its sandbox)
    repo = repo_factory({"requirements.txt": "", "train.py": TRAIN})
    cluster.flexai("training", "run", job_name, "-u", str(repo), "-E",
                   f"FINISH_FILE={finish}", "--", "train.py")  # fmt: skip
    job_id = cluster.wait_for(job_name, {"in progress"})["id"]
    connected = cluster.root / "agent" / "jobs" / job_id / "output" / "connected"
    output = tmp_path / "debug-ssh.log"  # a file, not a pipe ssh could hold open after it
    with output.open("wb") as sink:
        session = subprocess.Popen(
            [*FLEXAI, "training", "debug-ssh", job_name, "--", "sh", "-c",
             'touch "$FLEXAI_OUTPUT_DIR/connected"; exec sleep 60'],
            env=cluster.env, cwd=cluster.root, stdin=subprocess.DEVNULL, stdout=sink,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(lambda: connected.exists() or session.poll() is not None, timeout=60)
        assert connected.exists(), output.read_text()  # ssh ran the command on the node
        [opened] = [e for e in cluster.inspect(job_name)["history"]
                    if e["event"] == "DebugSessionOpened"]  # fmt: skip
        cluster.kill("server")
        finish.touch()  # the job ends while no server runs: its agent keeps the report
        exit_code = cluster.root / "agent" / "jobs" / job_id / "exit-code"
        wait_until(exit_code.exists, timeout=30)
        session.wait(timeout=30)  # its relay went with the server: the CLI ends
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    cluster.restart("server")
    document = cluster.wait_for(job_name, {"succeeded"}, timeout=60)

    closed = [e for e in document["history"] if e["event"] == "DebugSessionClosed"]
    assert [e["facts"]["session_id"] for e in closed] == [opened["facts"]["session_id"]]
    assert closed[0]["facts"]["reason"].startswith("server_restarted: ")
    assert closed[0]["by"] == {"kind": "scheduler", "id": "scheduler"}
    assert opened["facts"]["relay"]  # the killed server's instance
    inspected = cluster.flexai("training", "inspect", job_name).stdout
    history = cluster.flexai("training", "history", job_name, "--full").stdout
    for shown in (inspected, history):
        assert "DebugSessionClosed" in shown and "reason=server_restarted:" in shown
