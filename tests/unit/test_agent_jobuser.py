"""Jobs run as another user than the agent (root): real processes, real users, real files."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent import workdir
from node_agent.jobdirs import JobDirs
from node_agent.main import main
from node_agent.run.jobuser import job_user
from tests.support import build_wheel, can_run_jobs_as, make_repo, world_readable_directory
from tests.support import python_for_user as find_python
from tests.unit.test_agent_supervisor import FakeControlPlane, end_every_job, supervise

pytestmark = pytest.mark.skipif(bool(can_run_jobs_as("nobody")), reason=can_run_jobs_as("nobody"))
__all__ = ["end_every_job"]  # its autouse cleanup applies here too


@pytest.fixture(scope="module")
def nobody_python() -> str:
    """An interpreter nobody can run: jobs' virtual environments are made from it."""
    found = find_python("nobody")
    if found is None:
        pytest.skip("no Python interpreter here that nobody can run with venv and pip")
    return found


# Looks for the agent's files, then plants links to them where the agent collects outputs.
PRYING_JOB = """
import json, os, pathlib, sys
import tinydep
read = {}
for path in sys.argv[1:]:
    try:
        read[path] = pathlib.Path(path).read_text()
    except OSError as error:
        read[path] = type(error).__name__
seen = {"uid": os.getuid(), "home": os.environ["HOME"], "dependency": tinydep.VALUE}
print("SEEN " + json.dumps({**seen, "read": read}))
out = pathlib.Path(os.environ["FLEXAI_OUTPUT_DIR"])
os.symlink(sys.argv[1], out / "agent-id")
(out / "model.txt").write_text("weights")
checkpoint = pathlib.Path(os.environ["FLEXAI_OUTPUT_CHECKPOINT_DIR"], "checkpoint-1")
checkpoint.mkdir()
os.symlink(sys.argv[1], checkpoint / "agent-id")
(checkpoint / "w.bin").write_bytes(b"w")
"""


@pytest.fixture
def open_dir() -> Iterator[Path]:
    with world_readable_directory() as path:
        yield path


def test_a_job_runs_as_the_job_user_and_reaches_none_of_the_agents_files(
    open_dir: Path, nobody_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_dir = open_dir / "agent"
    with workdir.exclusive(agent_dir, jobs_run_as_another_user=True):
        agent_id = agent_dir / "agent-id"
        workdir.agent_id(agent_dir)
        wheels = open_dir / "wheels"
        wheels.mkdir()
        build_wheel(wheels, "tinydep", "1.0", "VALUE = 'installed'\n")
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
        repo = make_repo(
            open_dir / "origin", {"train.py": PRYING_JOB, "requirements.txt": "tinydep\n"}
        )
        plane = FakeControlPlane()
        settings = {
            "job_user": job_user("nobody"),
            "job_python": nobody_python,
            "keep_job_dirs": True,
        }
        entry_point = ["train.py", str(agent_id), str(agent_dir / "agent.lock")]
        supervise(open_dir, plane, str(repo), entry_point=entry_point, settings=settings).join(60)

    assert plane.reports("job-1") == ["built", "exited"], plane.log_text("job-1")
    assert plane.report_facts("job-1", "exited")["exit_code"] == 0
    log = plane.log_text("job-1")
    seen = json.loads(next(line[5:] for line in log.splitlines() if line.startswith("SEEN ")))
    dirs = JobDirs.for_job(agent_dir, "job-1")
    assert seen["uid"] == 65534
    assert seen["home"] == str(dirs.home)
    assert seen["dependency"] == "installed"  # pip ran, as nobody
    assert set(seen["read"].values()) == {"PermissionError"}
    assert dirs.venv.stat().st_uid == 65534
    assert dirs.log_file.stat().st_uid == 0  # the job reads its log, cannot rewrite it
    assert stat.S_IMODE(agent_dir.stat().st_mode) == 0o711  # passable, not listable
    assert stat.S_IMODE(agent_id.stat().st_mode) == 0o600
    # The links the job planted were left out of what the agent uploaded.
    assert ("outputs", "job-1", {"model.txt": b"weights"}) in plane.events
    assert ("checkpoint", "job-1", "checkpoint-1", {"w.bin": b"w"}) in plane.events


def run_agent_main(tmp_path: Path, *extra: str) -> int:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    argv = ["--server", "http://127.0.0.1:9", "--token-file", str(token), "--accels", "1"]
    argv += ["--connect-timeout", "0.2", "--no-sandbox", *extra]  # the shared job user's checks
    return main(argv)


def test_a_job_user_that_does_not_exist_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_agent_main(tmp_path, "--work-dir", str(tmp_path / "a"), "--job-user", "nope-x")
    assert code == 1
    assert capsys.readouterr().err == (
        "flexai agent: error: there is no user nope-x on this host to run jobs as (--job-user); "
        "create it (useradd --system nope-x) or name another\n"
    )


def test_a_work_dir_the_job_user_cannot_enter_is_refused_at_start(
    tmp_path: Path, nobody_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # pytest's temporary directories are root's alone: nobody cannot reach a job in there.
    argv = ["--work-dir", str(tmp_path / "agent"), "--job-python", nobody_python]
    code = run_agent_main(tmp_path, *argv)
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"flexai agent: error: the job user nobody cannot enter {tmp_path / 'agent' / 'jobs'} "
        "(Permission denied)"
    )


def test_a_job_python_the_job_user_cannot_run_is_refused_at_start(
    tmp_path: Path, open_dir: Path, nobody_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    private_python = tmp_path / "python3"  # in a directory nobody cannot enter
    private_python.symlink_to(os.path.realpath(nobody_python))
    argv = ["--work-dir", str(open_dir / "agent"), "--job-python", str(private_python)]
    code = run_agent_main(tmp_path, *argv)
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"flexai agent: error: the job user nobody cannot run {private_python} "
        "(Permission denied), and jobs' virtual environments are made from it: pass "
        f"--job-python with an interpreter that user can run (e.g. --job-python {nobody_python})"
    )
