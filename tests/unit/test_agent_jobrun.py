"""A job's entry point through the shim: its output in the log file, its exit code in a file,
every process of the job ended on a stop (a setsid escapee too) with one SIGTERM each, and found
again by an agent that restarted."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from node_agent.jobdirs import JobDirs
from node_agent.models import MARKER_VARIABLE
from node_agent.run.jobrun import JobRun, read_number
from node_agent.run.launch import marker_of
from tests.support import STUBBORN_GROUP, alive, wait_until

# Prints its pid, starts a child that leaves the job's process group (and session) and
# prints its pid, then both sleep, ignoring SIGTERM.
ESCAPEE = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
child += "os.write(1, b'ESCAPED %d\\\\n' % os.getpid()); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
os.write(1, b"PID %d\\n" % os.getpid())
time.sleep(600)
"""

# Counts the SIGTERMs its process receives: each delivery writes a byte to the wakeup pipe, even
# one that arrives before the handler ran for the one before. "parent" starts a "child" in its
# process group and an "escapee" in a session of its own. Each prints "READY <role>", waits for
# a SIGTERM, saves for a second (a checkpoint) while more could come, prints "SIGTERMS <role> N".
COUNTS_SIGTERMS = """
import os, select, signal, subprocess, sys, time
role = sys.argv[1]
read, write = os.pipe()
os.set_blocking(write, False)
signal.set_wakeup_fd(write)
signal.signal(signal.SIGTERM, lambda signum, frame: None)
if role == "parent":
    for other in ("child", "escapee"):
        subprocess.Popen([sys.executable, __file__, other], start_new_session=other == "escapee")
os.write(1, f"READY {role}\\n".encode())  # one write: the three share the log
select.select([read], [], [])
time.sleep(1.0)
os.set_blocking(read, False)
terms = os.read(read, 100).count(bytes([signal.SIGTERM]))
os.write(1, f"SIGTERMS {role} {terms}\\n".encode())
"""


@pytest.fixture
def dirs(tmp_path: Path) -> JobDirs:
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    dirs.repo.mkdir()
    dirs.log_file.write_bytes(b"[agent] before\n")
    return dirs


Launch = Callable[..., JobRun]


@pytest.fixture
def launch(job_runs: list[JobRun]) -> Launch:
    def start(dirs: JobDirs, *argv: str) -> JobRun:
        env = {**os.environ, **marker_of(dirs)}
        run = JobRun.launch(argv, dirs=dirs, env=env, python=sys.executable, as_user=None,
                            work_dir=dirs.root.parents[1])  # fmt: skip
        job_runs.append(run)
        return run

    return start


def pids(dirs: JobDirs, word: str) -> list[int]:
    lines = dirs.log_file.read_text().splitlines()
    return [int(line.split()[1]) for line in lines if line.startswith(f"{word} ")]


def test_the_output_is_appended_to_the_log_and_the_exit_code_written_to_a_file(
    dirs: JobDirs, launch: Launch
) -> None:
    run = launch(dirs, sys.executable, "-c", "import sys; print('out'); sys.exit(3)")
    assert run.wait(20)
    assert run.returncode() == 3
    assert dirs.log_file.read_text() == "[agent] before\nout\n"
    assert read_number(dirs.shim_pid_file) == run.shim_pid
    assert run.processes() == []


def test_an_entry_point_that_cannot_be_executed_ends_with_126_saying_why(
    dirs: JobDirs, launch: Launch
) -> None:
    run = launch(dirs, str(dirs.root / "missing"))
    assert run.wait(20)
    assert run.returncode() == 126
    assert "[agent] cannot start the entry point: [Errno 2]" in dirs.log_file.read_text()


def test_ending_the_job_ends_its_group_and_the_processes_that_left_it_with_setsid(
    dirs: JobDirs, launch: Launch
) -> None:
    run = launch(dirs, sys.executable, "-c", ESCAPEE)
    wait_until(lambda: pids(dirs, "PID") and pids(dirs, "ESCAPED"))
    escapee = pids(dirs, "ESCAPED")[0]
    assert os.getsid(escapee) != os.getsid(pids(dirs, "PID")[0])
    assert run.end(grace=0.3) == []
    assert not alive(escapee)
    assert not alive(pids(dirs, "PID")[0])
    assert run.returncode() == -9  # it ignored SIGTERM; the shim saw it killed


def test_an_entry_point_that_obeys_sigterm_is_recorded_as_killed_by_it(
    dirs: JobDirs, launch: Launch
) -> None:
    run = launch(dirs, sys.executable, "-c", STUBBORN_GROUP.replace("SIG_IGN", "SIG_DFL"))
    wait_until(lambda: len(pids(dirs, "PID")) == 3)
    assert run.end(grace=10) == []
    assert run.returncode() == -15


def test_each_process_of_the_job_receives_one_sigterm_on_a_stop_not_two(
    dirs: JobDirs, launch: Launch, tmp_path: Path
) -> None:
    script = tmp_path / "counts_sigterms.py"
    script.write_text(COUNTS_SIGTERMS)
    run = launch(dirs, sys.executable, str(script), "parent")
    wait_until(lambda: _words(dirs, "READY") == 3)
    assert run.end(grace=10) == []
    counts = sorted(line for line in dirs.log_file.read_text().splitlines()
                    if line.startswith("SIGTERMS "))  # fmt: skip
    assert counts == ["SIGTERMS child 1", "SIGTERMS escapee 1", "SIGTERMS parent 1"]
    assert run.returncode() == 0  # it saved, then exited by itself


def _words(dirs: JobDirs, word: str) -> int:
    return sum(line.startswith(f"{word} ") for line in dirs.log_file.read_text().splitlines())


def test_an_agent_that_restarted_finds_the_running_job_and_can_end_it(
    dirs: JobDirs, launch: Launch
) -> None:
    launch(dirs, sys.executable, "-c", ESCAPEE)
    wait_until(lambda: pids(dirs, "PID") and pids(dirs, "ESCAPED"))
    found = JobRun.find(dirs)  # as a new agent would, with no handle on the processes
    assert found is not None
    assert found.running()
    assert found.shim_pid == read_number(dirs.shim_pid_file)
    assert set(pids(dirs, "PID") + pids(dirs, "ESCAPED")) <= set(found.processes())
    assert found.end(grace=0.2) == []
    assert JobRun.find(dirs) is None
    assert found.returncode() == -9


def test_a_job_whose_shim_pid_file_names_another_process_is_not_found(dirs: JobDirs) -> None:
    dirs.shim_pid_file.write_text(f"{os.getpid()}\n")  # this process holds no marker
    assert MARKER_VARIABLE not in os.environ
    assert JobRun.find(dirs) is None


def test_the_job_directorys_files_are_read_without_following_links(
    dirs: JobDirs, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("7\n")
    dirs.exit_code_file.symlink_to(secret)
    assert read_number(dirs.exit_code_file) is None
    os.mkfifo(dirs.shim_pid_file)
    assert read_number(dirs.shim_pid_file) is None  # and it did not block
