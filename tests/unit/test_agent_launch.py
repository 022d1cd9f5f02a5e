"""How the agent turns an entry point into a command line, and the job's environment."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from domain.specs import PLATFORM_VARIABLES
from node_agent.jobdirs import JobDirs
from node_agent.models import MARKER_VARIABLE
from node_agent.run.launch import (
    EntryPointNotFound,
    Placement,
    build_environment,
    job_environment,
    resolve_entry_point,
)

SINGLE = Placement(node_index=0, nnodes=1, accels=1, master_addr="127.0.0.1", master_port=29500)
TORCHRUN = ["FLEXAI_NODE_INDEX", "NODE_RANK", "NNODES", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT"]  # fmt: skip


@pytest.fixture
def dirs(tmp_path: Path) -> JobDirs:
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    (dirs.repo / "scripts").mkdir(parents=True)
    dirs.venv_bin.mkdir(parents=True)
    (dirs.repo / "train.py").write_text("print('train')\n")
    return dirs


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(0o755)
    return path


def resolve(dirs: JobDirs, *entry_point: str) -> list[str]:
    return resolve_entry_point(entry_point, dirs.repo, dirs.venv)


def test_a_python_script_runs_with_the_venvs_python(dirs: JobDirs) -> None:
    argv = resolve(dirs, "train.py", "--lr", "0.1")
    assert argv == [str(dirs.venv_python), str(dirs.repo.resolve() / "train.py"), "--lr", "0.1"]


def test_a_module_runs_with_python_dash_m(dirs: JobDirs) -> None:
    assert resolve(dirs, "-m", "pkg.train", "--epochs", "2") == [
        str(dirs.venv_python),
        "-m",
        "pkg.train",
        "--epochs",
        "2",
    ]


def test_an_executable_of_the_repository_runs_from_the_repository(dirs: JobDirs) -> None:
    script = executable(dirs.repo / "scripts" / "run.sh")
    assert resolve(dirs, "scripts/run.sh", "x") == [str(script.resolve()), "x"]


def test_a_command_not_in_the_repository_is_looked_up_on_path(dirs: JobDirs) -> None:
    assert resolve(dirs, "echo", "hello") == [shutil.which("echo"), "hello"]


def test_a_command_given_by_its_absolute_path_runs_as_given(dirs: JobDirs) -> None:
    assert resolve(dirs, "/bin/sh", "-c", "true") == ["/bin/sh", "-c", "true"]


def test_a_command_installed_in_the_venv_wins_over_the_hosts(dirs: JobDirs) -> None:
    tool = executable(dirs.venv_bin / "echo")
    assert resolve(dirs, "echo") == [str(tool)]


@pytest.mark.parametrize(
    ("entry_point", "says"),
    [
        (("missing.py",), "'missing.py' is not a file of the repository"),
        (("../outside.py",), "'../outside.py' is not a file of the repository"),
        (("-m",), "`-m` needs a module name"),
        (("no-such-command-flexai",), "neither a file of the repository nor a command"),
        (("../../../../../../../usr/bin/id",), "'../../../../../../../usr/bin/id' is not a "
                                               "file of the repository; give a path inside it"),
        (("bin/missing",), "'bin/missing' is not a file of the repository"),
        ((), "the job has no entry point"),
    ],
)
def test_an_entry_point_that_names_nothing_runnable_is_not_found(
    dirs: JobDirs, entry_point: tuple[str, ...], says: str
) -> None:
    (dirs.root / "outside.py").write_text("")
    with pytest.raises(EntryPointNotFound, match=says.replace("(", r"\(")):
        resolve(dirs, *entry_point)


def test_a_repository_file_without_the_executable_bit_is_refused(dirs: JobDirs) -> None:
    (dirs.repo / "run.sh").write_text("echo hi\n")
    with pytest.raises(EntryPointNotFound, match="not executable"):
        resolve(dirs, "run.sh")


def test_the_job_environment_points_into_the_job_directory(dirs: JobDirs) -> None:
    base = {"PATH": "/usr/bin", "HOME": "/h"}
    env = job_environment(dirs, {"LR": "0.1"}, [0, 2], SINGLE, base=base)
    assert env["FLEXAI_OUTPUT_DIR"] == str(dirs.output)
    assert env["FLEXAI_OUTPUT_CHECKPOINT_DIR"] == str(dirs.output_checkpoint)
    assert env["FLEXAI_INPUT_CHECKPOINT_DIR"] == str(dirs.input_checkpoint)
    assert env["FLEXAI_INPUT_DIR"] == str(dirs.input)
    assert env["FLEXAI_RESTART_COUNT"] == "0"  # the first attempt
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["VIRTUAL_ENV"] == str(dirs.venv)
    assert env["PATH"] == f"{dirs.venv_bin}{os.pathsep}/usr/bin"
    assert env["LR"] == "0.1"
    assert env["HOME"] == str(dirs.home)  # not the agent's: its client config holds a token
    assert env["XDG_CONFIG_HOME"] == str(dirs.home / ".config")


def test_a_later_attempt_finds_its_restart_count_and_its_own_folders(dirs: JobDirs) -> None:
    third = dirs.for_attempt(3)
    env = job_environment(third, {"FLEXAI_RESTART_COUNT": "9"}, [0], SINGLE, base={},
                          restart_count=2)  # fmt: skip
    assert env["FLEXAI_RESTART_COUNT"] == "2"  # the platform's, not the user's
    assert env["FLEXAI_INPUT_CHECKPOINT_DIR"] == str(dirs.root / "input-checkpoint.attempt-3")
    assert env["FLEXAI_OUTPUT_CHECKPOINT_DIR"] == str(dirs.root / "output-checkpoint.attempt-3")
    assert env["FLEXAI_OUTPUT_DIR"] == str(dirs.root / "output.attempt-3")
    assert env["FLEXAI_INPUT_DIR"] == str(dirs.input)  # the datasets stay
    assert env["VIRTUAL_ENV"] == str(dirs.venv)  # and so does the build


def test_the_agents_token_never_reaches_the_job(dirs: JobDirs) -> None:
    base = {"FLEXAI_TOKEN": "secret", "FLEXAI_API_URL": "http://cp", "PATH": "/bin"}
    env = job_environment(dirs, {}, [0], SINGLE, base=base)
    assert "FLEXAI_TOKEN" not in env
    assert "FLEXAI_API_URL" not in env


def test_every_variable_the_node_sets_is_one_the_control_plane_refuses_in_env(
    dirs: JobDirs,
) -> None:
    """The agent's list and the ledger's (``PLATFORM_VARIABLES``) are kept apart by the rooms
    (neither may import the other): a variable added to one must be added to the other."""
    env = job_environment(dirs, {}, [0], SINGLE, base={})
    set_here = {name for name in env if name != "PATH"}  # PATH: the user's, the venv's first
    unguarded = {name for name in set_here
                 if name not in PLATFORM_VARIABLES and not name.startswith("FLEXAI_")}  # fmt: skip
    assert unguarded == set()


def test_the_platforms_variables_win_over_the_users(dirs: JobDirs) -> None:
    users = {"FLEXAI_OUTPUT_DIR": "/elsewhere", "CUDA_VISIBLE_DEVICES": "7", "NODE_RANK": "3",
             MARKER_VARIABLE: "someone-else's"}  # fmt: skip
    env = job_environment(dirs, users, [1], SINGLE, base={MARKER_VARIABLE: "the agent's"})
    assert env["FLEXAI_OUTPUT_DIR"] == str(dirs.output)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["NODE_RANK"] == "0"
    assert env[MARKER_VARIABLE] == dirs.marker


def test_an_agent_confined_to_some_gpus_hands_out_those_gpus(dirs: JobDirs) -> None:
    env = job_environment(dirs, {}, [1], SINGLE, base={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_single_node_job_finds_torchruns_variables_for_one_node(dirs: JobDirs) -> None:
    env = job_environment(dirs, {}, [0, 1, 2, 3], replace(SINGLE, accels=4), base={})
    assert {key: env[key] for key in TORCHRUN} == {
        "FLEXAI_NODE_INDEX": "0", "NODE_RANK": "0", "NNODES": "1", "LOCAL_WORLD_SIZE": "4",
        "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    }  # fmt: skip


def test_each_node_of_a_multi_node_job_finds_its_rank_and_the_rendezvous(dirs: JobDirs) -> None:
    second = Placement(node_index=1, nnodes=2, accels=8, master_addr="10.0.0.5", master_port=4242)
    env = job_environment(dirs, {}, list(range(8)), second, base={})
    assert {key: env[key] for key in TORCHRUN} == {
        "FLEXAI_NODE_INDEX": "1", "NODE_RANK": "1", "NNODES": "2", "LOCAL_WORLD_SIZE": "8",
        "WORLD_SIZE": "16", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4242",
    }  # fmt: skip
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_the_build_steps_carry_the_jobs_marker_too(dirs: JobDirs) -> None:
    assert build_environment(dirs, base={"FLEXAI_TOKEN": "secret"}) == {
        "HOME": str(dirs.home),
        "XDG_CONFIG_HOME": str(dirs.home / ".config"),
        MARKER_VARIABLE: dirs.marker,
    }
