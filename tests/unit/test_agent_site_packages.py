"""``flexai agent --job-site-packages``: a job's environment also sees the packages installed
for the job Python (a GPU host's preinstalled PyTorch), behind its own. Real virtual
environments, real builds, no index."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node_agent.build.builder import BuildCaches, JobBuild
from node_agent.build.envcache import host_site_packages, python_info
from node_agent.jobdirs import JobDirs
from node_agent.models import JobSpec
from tests.support import make_repo

HOST_ONLY = "flexai_host_only_package"


@pytest.fixture(scope="module")
def host_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A job Python with a package of its own: a virtual environment of the test's Python."""
    root = tmp_path_factory.mktemp("host") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = str(root / "bin" / "python")
    site = Path(python_info(python).site_packages)
    package = root / site / HOST_ONLY
    package.mkdir()
    (package / "__init__.py").write_text("WHERE = 'host'\n")
    return python


def build(tmp_path: Path, python: str, *, site_packages: bool, cached: bool) -> JobDirs:
    files = {"requirements.txt": "# nothing to install\n", "train.py": "print('hi')\n"}
    repo = make_repo(tmp_path / "origin", files)
    dirs = JobDirs.for_job(tmp_path / "agent", "job-1")
    dirs.create_fresh()
    JobBuild(
        JobSpec(repository_url=str(repo), repository_revision=None, entry_point=("train.py",)),
        dirs,
        log=lambda _line: None,
        python=python,
        caches=BuildCaches.in_work_dir(tmp_path / "agent") if cached else None,
        site_packages=site_packages,
    ).run()
    return dirs


def job_imports(dirs: JobDirs, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(dirs.venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd="/"
    )


@pytest.mark.parametrize("cached", [True, False], ids=["cached-env", "own-env"])
def test_the_job_sees_the_job_pythons_packages(
    tmp_path: Path, host_python: str, cached: bool
) -> None:
    dirs = build(tmp_path, host_python, site_packages=True, cached=cached)
    answer = job_imports(dirs, f"import {HOST_ONLY} as p; print(p.WHERE)")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "host"


@pytest.mark.parametrize("cached", [True, False], ids=["cached-env", "own-env"])
def test_without_the_flag_the_job_pythons_packages_stay_out(
    tmp_path: Path, host_python: str, cached: bool
) -> None:
    dirs = build(tmp_path, host_python, site_packages=False, cached=cached)
    answer = job_imports(dirs, f"import {HOST_ONLY}")
    assert answer.returncode != 0
    assert "ModuleNotFoundError" in answer.stderr


def test_the_jobs_own_packages_come_first(tmp_path: Path, host_python: str) -> None:
    dirs = build(tmp_path, host_python, site_packages=True, cached=True)
    own = dirs.venv / python_info(host_python).site_packages / HOST_ONLY
    own.mkdir()
    (own / "__init__.py").write_text("WHERE = 'job'\n")
    answer = job_imports(dirs, f"import {HOST_ONLY} as p; print(p.WHERE)")
    assert answer.stdout.strip() == "job", answer.stderr


def test_the_site_packages_are_those_of_the_job_python_itself(host_python: str) -> None:
    root = Path(host_python).parent.parent
    assert host_site_packages(host_python) == (str(root / python_info(host_python).site_packages),)
