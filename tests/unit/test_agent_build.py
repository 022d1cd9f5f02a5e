"""The node agent's build: real git repositories, real virtual environments, real pip (offline)."""

from __future__ import annotations

import subprocess
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from node_agent.build.builder import (
    BuildCancelled,
    BuildFailed,
    BuiltJob,
    CheckpointMissing,
    FetchCheckpoint,
    JobBuild,
)
from node_agent.build.secrets import JobSecrets, not_found
from node_agent.jobdirs import JobDirs
from node_agent.models import JobSpec
from tests.support import build_wheel, git, make_repo


def commit_file(repo: Path, name: str, text: str, message: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


class Repo:
    """main: first -> second; tag v1 on first; branch feature: first -> third."""

    def __init__(self, root: Path) -> None:
        files = {"requirements.txt": "# nothing to install\n", "train.py": "print('first')\n"}
        self.path = make_repo(root / "origin", files)
        self.first = git(self.path, "rev-parse", "HEAD")
        git(self.path, "tag", "v1")
        self.second = commit_file(self.path, "train.py", "print('second')\n", "second")
        git(self.path, "checkout", "-q", "-b", "feature", self.first)
        self.third = commit_file(self.path, "train.py", "print('third')\n", "third")
        git(self.path, "checkout", "-q", "main")


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def build(
    tmp_path: Path,
    url: str,
    revision: str | None = None,
    *,
    entry_point: tuple[str, ...] = ("train.py",),
    datasets_dir: Path | None = None,
    input_checkpoint_id: str | None = None,
    fetch_checkpoint: FetchCheckpoint | None = None,
    **spec: Any,
) -> tuple[BuiltJob, JobDirs, list[str]]:
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    lines: list[str] = []
    job_spec = JobSpec(
        repository_url=url, repository_revision=revision, entry_point=entry_point, **spec
    )
    built = JobBuild(
        job_spec,
        dirs,
        log=lines.append,
        datasets_dir=datasets_dir,
        input_checkpoint_id=input_checkpoint_id,
        fetch_checkpoint=fetch_checkpoint,
    ).run()
    return built, dirs, lines


def failure(tmp_path: Path, url: str, revision: str | None = None, **spec: Any) -> BuildFailed:
    with pytest.raises(BuildFailed) as caught:
        build(tmp_path, url, revision, **spec)
    return caught.value


def checked_out(dirs: JobDirs) -> str:
    return (dirs.repo / "train.py").read_text().strip()


def test_without_a_revision_the_default_branch_is_checked_out(tmp_path: Path, repo: Repo) -> None:
    built, dirs, _ = build(tmp_path, str(repo.path))
    assert built.commit == repo.second
    assert checked_out(dirs) == "print('second')"


def test_a_branch_revision_checks_out_the_branch_head(tmp_path: Path, repo: Repo) -> None:
    built, dirs, _ = build(tmp_path, str(repo.path), "feature")
    assert built.commit == repo.third
    assert checked_out(dirs) == "print('third')"


def test_a_tag_revision_checks_out_the_tagged_commit(tmp_path: Path, repo: Repo) -> None:
    built, dirs, _ = build(tmp_path, str(repo.path), "v1")
    assert built.commit == repo.first
    assert checked_out(dirs) == "print('first')"


def test_a_short_commit_revision_resolves_to_the_full_sha(tmp_path: Path, repo: Repo) -> None:
    built, dirs, _ = build(tmp_path, f"file://{repo.path}", repo.third[:8])
    assert built.commit == repo.third
    assert checked_out(dirs) == "print('third')"


def test_the_build_output_of_git_goes_to_the_job_log(tmp_path: Path, repo: Repo) -> None:
    _, _, lines = build(tmp_path, str(repo.path), "v1")
    assert any("Cloning into" in line for line in lines)
    assert f"checked out commit {repo.first}" in lines


def test_unknown_revision_fails_with_revision_not_found(tmp_path: Path, repo: Repo) -> None:
    error = failure(tmp_path, str(repo.path), "nope")
    assert error.code == "revision_not_found"
    assert error.message == (
        f"revision 'nope' not found in {repo.path}, check --repository-revision"
    )


def test_a_revision_that_looks_like_an_option_is_not_found(tmp_path: Path, repo: Repo) -> None:
    assert failure(tmp_path, str(repo.path), "--output=/tmp/x").code == "revision_not_found"


def test_a_repository_that_does_not_exist_fails_with_clone_failed(tmp_path: Path) -> None:
    error = failure(tmp_path, str(tmp_path / "missing"))
    assert error.code == "clone_failed"
    assert "does not exist" in error.message
    assert "--repository-url" in error.message


def test_missing_requirements_fails_with_requirements_not_found(tmp_path: Path, repo: Repo) -> None:
    error = failure(tmp_path, str(repo.path), requirements_path="deps/requirements.txt")
    assert error.code == "requirements_not_found"
    assert error.commit == repo.second
    assert error.message == (
        "requirements file 'deps/requirements.txt' not found at the repository root of "
        f"revision {repo.second}; add it or pass --requirements-path"
    )


def test_a_requirements_path_outside_the_repository_is_not_found(
    tmp_path: Path, repo: Repo
) -> None:
    (tmp_path / "outside.txt").write_text("")
    error = failure(tmp_path, str(repo.path), requirements_path="../../outside.txt")
    assert error.code == "requirements_not_found"


def test_an_unknown_package_fails_with_dependency_install_failed_and_pips_message(
    tmp_path: Path, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    commit_file(repo.path, "requirements.txt", "no-such-package-flexai==1.0\n", "deps")
    error = failure(tmp_path, str(repo.path))
    assert error.code == "dependency_install_failed"
    assert error.message.startswith("dependency installation failed: ")
    assert "No matching distribution found for no-such-package-flexai" in error.message


def test_requirements_are_installed_into_the_jobs_own_venv(
    tmp_path: Path, repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(
        wheels, "hello_flexai", "1.0", "GREETING = 'hello from the job venv'\n", package=True
    )
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    commit_file(repo.path, "requirements.txt", "hello-flexai\n", "deps")
    _, dirs, lines = build(tmp_path, str(repo.path))
    greeting = subprocess.run(
        [dirs.venv_python, "-c", "import hello_flexai; print(hello_flexai.GREETING)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert greeting == "hello from the job venv"
    assert any("Successfully installed hello-flexai" in line for line in lines)


def test_a_requirements_file_with_only_comments_installs_nothing(
    tmp_path: Path, repo: Repo
) -> None:
    _, dirs, lines = build(tmp_path, str(repo.path))
    assert dirs.venv_python.exists()
    assert "no requirements in requirements.txt, nothing to install" in lines


def test_datasets_are_linked_under_the_input_directory(tmp_path: Path, repo: Repo) -> None:
    datasets = tmp_path / "datasets"
    (datasets / "mnist").mkdir(parents=True)
    (datasets / "mnist" / "train.csv").write_text("1,2\n")
    _, dirs, _ = build(tmp_path, str(repo.path), datasets=("mnist",), datasets_dir=datasets)
    assert (dirs.input / "mnist" / "train.csv").read_text() == "1,2\n"


def test_a_dataset_missing_on_the_node_fails_with_dataset_not_found(
    tmp_path: Path, repo: Repo
) -> None:
    (tmp_path / "datasets").mkdir()
    error = failure(
        tmp_path, str(repo.path), datasets=("imagenet",), datasets_dir=tmp_path / "datasets"
    )
    assert error.code == "dataset_not_found"
    assert "'imagenet'" in error.message


def test_a_secret_the_owner_lacks_fails_the_build_with_secret_not_found_before_cloning(
    tmp_path: Path, repo: Repo
) -> None:
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    spec = JobSpec(repository_url=str(repo.path), entry_point=("train.py",),
                   secrets={"HF_TOKEN": "hf"})  # fmt: skip
    missing = JobSecrets(failure=not_found(["hf"], spec.secrets))
    with pytest.raises(BuildFailed) as caught:
        JobBuild(spec, dirs, log=lambda line: None, secrets=missing).run()
    assert caught.value.code == "secret_not_found"
    assert "'hf' (for HF_TOKEN)" in caught.value.message
    assert "`flexai secret create hf`" in caught.value.message
    assert not dirs.repo.exists()


def test_the_input_checkpoint_is_unpacked(tmp_path: Path, repo: Repo) -> None:
    def fetch(checkpoint_id: str, destination: Path) -> None:
        assert checkpoint_id == "ckpt-1"
        with zipfile.ZipFile(destination, "w") as bundle:
            bundle.writestr("weights/model.bin", b"\x00\x01")

    _, dirs, _ = build(
        tmp_path, str(repo.path), input_checkpoint_id="ckpt-1", fetch_checkpoint=fetch
    )
    assert (dirs.input_checkpoint / "weights" / "model.bin").read_bytes() == b"\x00\x01"
    assert not list(dirs.scratch.iterdir())


def test_an_unknown_input_checkpoint_fails_with_checkpoint_not_found(
    tmp_path: Path, repo: Repo
) -> None:
    def fetch(checkpoint_id: str, destination: Path) -> None:
        raise CheckpointMissing("404 checkpoint-not-found")

    error = failure(tmp_path, str(repo.path), input_checkpoint_id="gone", fetch_checkpoint=fetch)
    assert error.code == "checkpoint_not_found"


def test_a_missing_entry_point_script_fails_with_entry_point_not_found(
    tmp_path: Path, repo: Repo
) -> None:
    error = failure(tmp_path, str(repo.path), entry_point=("missing.py",))
    assert error.code == "entry_point_not_found"
    assert error.commit == repo.second


def test_a_stop_during_the_build_cancels_it(tmp_path: Path, repo: Repo) -> None:
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    cancel = threading.Event()
    cancel.set()
    spec = JobSpec(repository_url=str(repo.path), entry_point=("train.py",))
    with pytest.raises(BuildCancelled):
        JobBuild(spec, dirs, log=lambda _: None, cancel=cancel).run()
