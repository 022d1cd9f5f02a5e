"""The node's build caches: Python environments built once and shared read-only, and git
mirrors that fetch only what is new (real git, real virtual environments, pip offline)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from node_agent.build.builder import BuildCaches, BuildFailed, BuiltJob, JobBuild
from node_agent.build.envcache import (
    EnvCache,
    Python,
    environment_key,
    is_cacheable,
    python_info,
)
from node_agent.build.filelock import FileLock
from node_agent.build.gitmirror import GitMirrors
from node_agent.jobdirs import JobDirs
from node_agent.models import JobSpec
from tests.support import build_wheel, git, make_repo
from tests.unit.test_agent_build import Repo, commit_file

PYTHON = Python("/usr/bin/python3", "/usr/bin/python3", "3.11.7 (main)", 3, 11)


def build_with_caches(
    work_dir: Path, job_id: str, url: str, revision: str | None = None, **spec: Any
) -> tuple[BuiltJob, JobDirs, list[str]]:
    dirs = JobDirs.for_job(work_dir, job_id)
    dirs.create_fresh()
    lines: list[str] = []
    job_spec = JobSpec(
        repository_url=url, repository_revision=revision, entry_point=("train.py",), **spec
    )
    caches = BuildCaches.in_work_dir(work_dir)
    built = JobBuild(job_spec, dirs, log=lines.append, caches=caches).run()
    return built, dirs, lines


def run_python(dirs: JobDirs, code: str) -> str:
    answer = subprocess.run(
        [dirs.venv_python, "-c", code], capture_output=True, text=True, check=True
    )
    return answer.stdout.strip()


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    build_wheel(folder, "tinydep", "1.0", "VALUE = 'one'\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


# -- the key -----------------------------------------------------------------------------


def test_the_key_changes_with_the_requirements_the_python_and_the_index() -> None:
    key = environment_key(b"numpy==2.0\n", PYTHON, {})
    assert key == environment_key(b"numpy==2.0\n", PYTHON, {"HOME": "/elsewhere"})
    assert key != environment_key(b"numpy==2.1\n", PYTHON, {})
    other_version = Python(PYTHON.path, PYTHON.base, "3.11.8 (main)", 3, 11)
    assert key != environment_key(b"numpy==2.0\n", other_version, {})
    other_path = Python("/opt/python3", PYTHON.base, PYTHON.version, 3, 11)
    assert key != environment_key(b"numpy==2.0\n", other_path, {})
    assert key != environment_key(b"numpy==2.0\n", PYTHON, {"PIP_INDEX_URL": "https://x"})
    assert environment_key(b"", PYTHON, {}) != environment_key(b"\n", PYTHON, {})


def test_requirements_that_name_local_files_are_not_cached() -> None:
    assert is_cacheable(b"numpy==2.0\n# a comment\n\ntorch>=2  # pinned later\n")
    assert is_cacheable(b"")
    for line in (b"-e .", b"./pkg", b"/opt/wheels/x.whl", b"-r base.txt", b"x @ file:///tmp/x"):
        assert not is_cacheable(b"numpy\n" + line + b"\n"), line


# -- the cache ---------------------------------------------------------------------------


def test_two_jobs_needing_one_environment_at_once_build_it_once(tmp_path: Path) -> None:
    envs = EnvCache(tmp_path / "envs")
    builds: list[Path] = []

    def slow_build(venv: Path) -> None:
        builds.append(venv)
        (venv / "bin").mkdir(parents=True)
        time.sleep(0.3)

    got: list[tuple[Path, bool]] = []
    threads = [
        threading.Thread(
            target=lambda: got.append(
                envs.get("k" * 64, slow_build, cancel=threading.Event(), user=None)
            )
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert sorted(built for _, built in got) == [False, True]
    assert {path for path, _ in got} == {tmp_path / "envs" / ("k" * 64)}
    assert [p.name for p in (tmp_path / "envs").iterdir() if not p.name.endswith(".lock")] == [
        "k" * 64
    ]


def test_a_failed_build_is_not_cached_and_the_next_job_builds_again(tmp_path: Path) -> None:
    envs = EnvCache(tmp_path / "envs")

    def failing(venv: Path) -> None:
        venv.mkdir()
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError):
        envs.get("f" * 64, failing, cancel=threading.Event(), user=None)
    def working(venv: Path) -> None:
        (venv / "bin").mkdir(parents=True)

    _, built = envs.get("f" * 64, working, cancel=threading.Event(), user=None)
    assert built


def test_the_second_job_says_its_environment_is_cached(tmp_path: Path, wheels: Path) -> None:
    repo = make_repo(tmp_path / "origin", {"train.py": "pass\n", "requirements.txt": "tinydep\n"})
    work_dir = tmp_path / "agent"
    _, first, first_lines = build_with_caches(work_dir, "job-1", str(repo))
    _, second, second_lines = build_with_caches(work_dir, "job-2", str(repo))
    key = environment_key(b"tinydep\n", python_info(sys.executable), os.environ)[:12]
    assert f"environment: built and cached for the next jobs (key {key})" in first_lines
    assert any("tinydep" in line for line in first_lines)  # the installer's own output
    assert f"environment: cached (key {key})" in second_lines
    assert not any("tinydep" in line for line in second_lines)
    assert run_python(second, "import tinydep; print(tinydep.VALUE)") == "one"
    assert first.venv != second.venv


def test_a_jobs_runtime_pip_install_goes_to_its_own_venv_not_the_cache(
    tmp_path: Path, wheels: Path
) -> None:
    build_wheel(wheels, "tinydep", "2.0", "VALUE = 'two'\n")
    repo = make_repo(
        tmp_path / "origin", {"train.py": "pass\n", "requirements.txt": "tinydep==1.0\n"}
    )
    work_dir = tmp_path / "agent"
    _, first, _ = build_with_caches(work_dir, "job-1", str(repo))
    cache = next(p for p in (work_dir / "envs").iterdir() if not p.name.startswith("."))
    before = _snapshot(cache)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(first.venv_python), "install", "-q",
         "--disable-pip-version-check", "tinydep==2.0"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert run_python(first, "import tinydep; print(tinydep.VALUE)") == "two"
    assert _snapshot(cache) == before
    _, second, _ = build_with_caches(work_dir, "job-2", str(repo))
    assert run_python(second, "import tinydep; print(tinydep.VALUE)") == "one"


def test_the_cached_environment_is_read_only(tmp_path: Path, wheels: Path) -> None:
    repo = make_repo(tmp_path / "origin", {"train.py": "pass\n", "requirements.txt": "tinydep\n"})
    build_with_caches(tmp_path / "agent", "job-1", str(repo))
    cache = next(p for p in (tmp_path / "agent" / "envs").iterdir() if not p.name.startswith("."))
    for path in [cache, *cache.rglob("*")]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o222 == 0, path


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


# -- the git mirror ----------------------------------------------------------------------


def test_revisions_resolve_through_the_mirror_as_they_do_without_it(
    tmp_path: Path, repo: Repo
) -> None:
    work_dir = tmp_path / "agent"
    cases = [(None, repo.second), ("feature", repo.third), ("v1", repo.first),
             (repo.third[:8], repo.third)]  # fmt: skip
    for index, (revision, commit) in enumerate(cases):
        built, dirs, _ = build_with_caches(work_dir, f"job-{index}", str(repo.path), revision)
        assert built.commit == commit
        assert git(dirs.repo, "remote", "get-url", "origin") == str(repo.path)
    assert len(list((work_dir / "git-mirrors").glob("*.git"))) == 1


def test_an_unknown_revision_or_repository_fails_as_without_the_mirror(
    tmp_path: Path, repo: Repo
) -> None:
    work_dir = tmp_path / "agent"
    with pytest.raises(BuildFailed) as unknown:
        build_with_caches(work_dir, "job-1", str(repo.path), "nope")
    assert unknown.value.code == "revision_not_found"
    with pytest.raises(BuildFailed) as missing:
        build_with_caches(work_dir, "job-2", str(tmp_path / "missing"))
    assert missing.value.code == "clone_failed"
    assert "does not exist" in missing.value.message
    assert "--repository-url" in missing.value.message


def test_a_new_commit_is_seen_and_only_what_is_new_is_fetched(tmp_path: Path, repo: Repo) -> None:
    work_dir = tmp_path / "agent"
    build_with_caches(work_dir, "job-1", str(repo.path))
    mirror = next((work_dir / "git-mirrors").glob("*.git"))
    packed_before = _objects(mirror)
    newest = commit_file(repo.path, "train.py", "print('fourth')\n", "fourth")
    built, dirs, _ = build_with_caches(work_dir, "job-2", str(repo.path))
    assert built.commit == newest
    assert (dirs.repo / "train.py").read_text() == "print('fourth')\n"
    after = _objects(mirror)
    assert after["in-pack"] == packed_before["in-pack"]  # nothing fetched again
    assert after["count"] == packed_before["count"] + 3  # the commit, its tree, its blob


def test_a_branch_deleted_at_the_origin_is_not_found_any_more(tmp_path: Path, repo: Repo) -> None:
    work_dir = tmp_path / "agent"
    build_with_caches(work_dir, "job-1", str(repo.path), "feature")
    git(repo.path, "branch", "-D", "feature")
    with pytest.raises(BuildFailed) as gone:
        build_with_caches(work_dir, "job-2", str(repo.path), "feature")
    assert gone.value.code == "revision_not_found"


def test_a_new_default_branch_at_the_origin_is_followed(tmp_path: Path, repo: Repo) -> None:
    work_dir = tmp_path / "agent"
    build_with_caches(work_dir, "job-1", str(repo.path))
    git(repo.path, "symbolic-ref", "HEAD", "refs/heads/feature")
    built, _, _ = build_with_caches(work_dir, "job-2", str(repo.path))
    assert built.commit == repo.third


def test_a_jobs_clone_holds_its_own_objects(tmp_path: Path, repo: Repo) -> None:
    work_dir = tmp_path / "agent"
    _, dirs, _ = build_with_caches(work_dir, "job-1", str(repo.path))
    assert not (dirs.repo / ".git" / "objects" / "info" / "alternates").exists()
    for mirror in (work_dir / "git-mirrors").glob("*.git"):
        subprocess.run(["git", "-C", str(mirror), "repack", "-a", "-d", "-q"], check=True)
        subprocess.run(["git", "-C", str(mirror), "prune"], check=True)
    assert git(dirs.repo, "log", "--format=%H", "-1", repo.second) == repo.second


def _objects(mirror: Path) -> dict[str, int]:
    counted = git(mirror, "count-objects", "-v").splitlines()
    return {line.split(": ")[0]: int(line.split(": ")[1]) for line in counted if ": " in line
            and line.split(": ")[1].isdigit()}  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def test_jobs_of_one_repository_at_once_look_at_the_origin_once(
    tmp_path: Path, repo: Repo
) -> None:
    mirrors = GitMirrors(tmp_path / "git-mirrors")
    looks: list[str] = []

    def run_git(args: Sequence[str], cwd: Path) -> tuple[int, list[str]]:
        if args[0] in ("ls-remote", "fetch"):
            looks.append(args[0])
            time.sleep(0.2)  # the other jobs are waiting for the lock meanwhile
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
        return done.returncode, (done.stdout + done.stderr).splitlines()

    def clone(index: int) -> None:
        mirrors.clone(str(repo.path), tmp_path / f"clone-{index}", git=run_git,
                      cancel=threading.Event())  # fmt: skip

    clone(0)  # creates the mirror
    threads = [threading.Thread(target=clone, args=(index,)) for index in range(1, 4)]
    mirror = mirrors.path(str(repo.path))
    with FileLock(mirrors.root / f"{mirror.name}.lock", threading.Event()):
        for thread in threads:  # all three asked before any of them may look
            thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join()
    assert looks == ["ls-remote"]
    newest = commit_file(repo.path, "train.py", "print('later')\n", "later")
    clone(4)  # asked after the last look: it looks again, and fetches
    assert looks == ["ls-remote", "ls-remote", "fetch"]
    assert git(tmp_path / "clone-4", "rev-parse", "origin/main") == newest


def test_a_commit_checked_out_before_is_copied_and_a_moved_branch_is_still_followed(
    tmp_path: Path, repo: Repo
) -> None:
    work_dir = tmp_path / "agent"
    first, _, first_lines = build_with_caches(work_dir, "job-1", str(repo.path))
    again, dirs, again_lines = build_with_caches(work_dir, "job-2", str(repo.path))
    assert again.commit == first.commit
    assert any("a copy of this node's earlier checkout" in line for line in again_lines)
    assert not any("copy of this node" in line for line in first_lines)
    git = ["git", "-C", str(dirs.repo)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.stdout.strip() == first.commit  # a working repository, at that commit
    (dirs.repo / "train.py").write_text("changed by the job\n")  # the kept copy stays clean
    newest = commit_file(repo.path, "train.py", "print('newest')\n", "newest")
    moved, moved_dirs, _ = build_with_caches(work_dir, "job-3", str(repo.path))
    assert moved.commit == newest
    assert (moved_dirs.repo / "train.py").read_text() == "print('newest')\n"
    _, back, _ = build_with_caches(work_dir, "job-4", str(repo.path), first.commit)
    assert (back.repo / "train.py").read_text() != "changed by the job\n"


def test_a_kept_checkout_is_a_compact_repository_that_git_reads_as_the_clone(
    tmp_path: Path, repo: Repo
) -> None:
    """Each job copies the kept checkout and deletes its copy when it ends: its ``.git`` is
    few files (loose objects packed, loose refs in ``packed-refs``, no hook examples nor the
    branches' reflogs), and git reads it as it reads the clone."""
    work_dir = tmp_path / "agent"
    first, clone_dirs, _ = build_with_caches(work_dir, "job-1", str(repo.path))
    again, dirs, lines = build_with_caches(work_dir, "job-2", str(repo.path))
    assert any("a copy of this node's earlier checkout" in line for line in lines)
    dot_git = dirs.repo / ".git"
    entries = {str(path.relative_to(dot_git)) for path in dot_git.rglob("*")}
    packs = {entry for entry in entries if entry.startswith("objects/pack/pack-")}
    assert entries - packs == {"HEAD", "config", "index", "packed-refs", "objects",
                               "objects/pack", "refs", "refs/remotes", "refs/remotes/origin",
                               "refs/remotes/origin/HEAD", "logs", "logs/HEAD"}  # fmt: skip
    assert {Path(pack).suffix for pack in packs} >= {".pack", ".idx"}
    clone_entries = list((clone_dirs.repo / ".git").rglob("*"))
    assert len(entries) * 2 < len(clone_entries)
    for args in (["rev-parse", "HEAD"], ["status", "--porcelain"], ["log", "--format=%H"],
                 ["branch", "-a", "--format=%(refname)"], ["tag"], ["remote", "get-url", "origin"],
                 ["show", "--stat", "--format=%s", "v1"], ["status"]):  # fmt: skip
        assert git(dirs.repo, *args) == git(clone_dirs.repo, *args), args
    assert git(dirs.repo, "rev-parse", "HEAD") == again.commit == first.commit
    assert subprocess.run(["git", "-C", str(dirs.repo), "fsck", "--strict"],
                          capture_output=True).returncode == 0  # fmt: skip
    git(dirs.repo, "commit", "--allow-empty", "-m", "a job may commit in its copy")
    kept = next((work_dir / "git-mirrors" / "checkouts").glob("*/*"))
    assert git(kept, "rev-parse", "HEAD") == first.commit
