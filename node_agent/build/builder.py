"""Build one job's environment: git checkout, virtual environment, dependencies, inputs.

Each step either succeeds or raises :class:`BuildFailed` with a failure code from the design
and a message the user can act on. Everything git and pip print goes to ``log`` so the user
sees it in ``flexai training logs``.

The agent does every step that needs its own rights (git, with the agent's credentials for
private repositories; datasets; the input checkpoint) first; then it hands the job's directory
to the job's user, who runs the steps that run code from the repository or its requirements
(the virtual environment, pip).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.contract import Refusal, repository_kind
from node_agent.build.datasets import DatasetCache, DatasetUnavailable, provide_datasets
from node_agent.build.envcache import (
    EnvCache,
    add_host_site_packages,
    is_cacheable,
    python_info,
)
from node_agent.build.environment import (
    CachedEnvironment,
    EnvironmentFailed,
    has_requirements,
)
from node_agent.build.filelock import LockCancelled
from node_agent.build.gitmirror import GitMirrors, MirrorFailed
from node_agent.build.secrets import JobSecrets, unavailable
from node_agent.build.unpack import ArchiveRefused, UnpackLimits, unpack
from node_agent.jobdirs import JobDirs
from node_agent.models import JobSpec
from node_agent.run.jobuser import JobUser, hand_over
from node_agent.run.launch import EntryPointNotFound, build_environment, resolve_entry_point
from node_agent.run.processes import run_command

FetchCheckpoint = Callable[[str, Path], None]
"""Save checkpoint ``id``'s zip at the given path; raise :class:`CheckpointMissing` if none."""


class BuildFailed(Exception):
    def __init__(self, code: str, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.commit = commit


class BuildCancelled(Exception):
    """The job was asked to stop while it was building."""


class CheckpointMissing(Exception):
    """The control plane has no such checkpoint."""


@dataclass(frozen=True)
class BuiltJob:
    commit: str
    argv: tuple[str, ...]
    """The entry point as the command line to run, from the repository root."""
    image_digest: str | None = None
    """The manifest digest of the image the job runs in (``runtime_image``), if it names one."""


@dataclass(frozen=True)
class BuildCaches:
    """What the jobs of a node share: their Python environments, repository mirrors."""

    envs: EnvCache
    mirrors: GitMirrors

    @classmethod
    def in_work_dir(cls, work_dir: Path) -> BuildCaches:
        return cls(EnvCache(work_dir / "envs"), GitMirrors(work_dir / "git-mirrors"))


class JobBuild:
    """The build of one job in its work directory; :meth:`run` does it all."""

    def __init__(
        self,
        spec: JobSpec,
        dirs: JobDirs,
        *,
        log: Callable[[str], None],
        cancel: threading.Event | None = None,
        datasets_dir: Path | None = None,
        dataset_cache: DatasetCache | None = None,
        input_checkpoint_id: str | None = None,
        fetch_checkpoint: FetchCheckpoint | None = None,
        as_user: JobUser | None = None,
        python: str = sys.executable,
        caches: BuildCaches | None = None,
        asked: float | None = None,
        secrets: JobSecrets | None = None,
        site_packages: bool = False,
    ) -> None:
        self.spec = spec
        self.dirs = dirs
        self.log = log
        self.cancel = cancel or threading.Event()
        self.datasets_dir = datasets_dir
        self.dataset_cache = dataset_cache
        """Where datasets pushed to the control plane come from; None: --datasets-dir only."""
        self.input_checkpoint_id = input_checkpoint_id
        self.fetch_checkpoint = fetch_checkpoint
        self.as_user = as_user
        self.python = python
        """The interpreter the job's virtual environment is made from (its pip installs)."""
        self.caches = caches
        """None: every job clones its repository and builds its environment afresh."""
        self.asked = asked
        """When (``time.monotonic()``) the agent learned of the job: a look at the origin's
        branches begun since then is recent enough for it. None: when the build begins."""
        self.secrets = secrets
        """The values of the job's ``--secret`` variables, fetched before the build."""
        self.site_packages = site_packages
        """The environment also sees ``python``'s own packages, behind its requirements."""
        self.commit: str | None = None

    def run(self) -> BuiltJob:
        self.require_secrets()
        self.checkout()
        requirements = self.find_requirements()
        self.link_datasets()
        self.unpack_input_checkpoint()
        if self.as_user is not None and not self.as_user.is_agent:
            self.log(f"the job's own code runs as user {self.as_user.name} from here on")
            hand_over(self.dirs, self.as_user)
        self.prepare_environment(requirements)
        try:
            argv = resolve_entry_point(
                self.spec.entry_point, self.dirs.repo, self.dirs.venv, self.spec.env
            )
        except EntryPointNotFound as error:
            raise BuildFailed("entry_point_not_found", str(error), self.commit) from None
        assert self.commit is not None
        self.log(f"environment ready at commit {self.commit}")
        return BuiltJob(commit=self.commit, argv=tuple(argv))

    # -- steps ---------------------------------------------------------------------------

    def require_secrets(self) -> None:
        """Every ``--secret`` has its value, or the build fails saying which one has none."""
        if not self.spec.secrets:
            return
        failure = (self.secrets or JobSecrets(failure=unavailable("not fetched"))).failure
        if failure is not None:
            raise BuildFailed(failure.code, failure.message)

    def checkout(self) -> None:
        url, revision = self.spec.repository_url, self.spec.repository_revision
        try:
            repository_kind(url)  # the server refused it already: this is the last guard
        except Refusal as refusal:
            raise BuildFailed("clone_failed", f"refused to clone: {refusal}") from None
        if self._copy_kept_checkout(url, revision):
            return
        self.log(f"cloning {url}" + (f" at revision {revision}" if revision else ""))
        code, tail = self._clone(url)
        if code != 0:
            raise BuildFailed(
                "clone_failed",
                f"cannot clone {url}: {tail or f'git exited with code {code}'}; "
                "check --repository-url and that this node can read it",
            )
        commit = self._resolve(revision) if revision else self._rev_parse("HEAD")
        if commit is None and not revision:
            raise BuildFailed("clone_failed", f"{url} has no commit on its default branch")
        if commit is None:
            raise BuildFailed(
                "revision_not_found",
                f"revision '{revision}' not found in {url}, check --repository-revision",
            )
        code, tail = self._git(["checkout", "--quiet", "--detach", commit], cwd=self.dirs.repo)
        if code != 0:
            raise BuildFailed("clone_failed", f"cannot check out {commit} of {url}: {tail}")
        self.commit = commit
        self.log(f"checked out commit {commit}")
        if self.caches is not None:
            mirrors = self.caches.mirrors
            mirrors.keep(mirrors.path(url), commit, self.dirs.repo, git=self._git_lines)

    def _copy_kept_checkout(self, url: str, revision: str | None) -> bool:
        """A commit an earlier job of this node checked out is copied, no git process run
        (the mirror is still brought up to date first, so a branch names its newest commit)."""
        if self.caches is None:
            return False
        mirrors = self.caches.mirrors
        try:
            mirror = mirrors.refresh(
                url, git=self._git_lines, cancel=self.cancel, asked=self.asked
            )
        except MirrorFailed:
            return False  # the slow path says why
        except LockCancelled:
            raise BuildCancelled() from None
        commit = mirrors.branch_commit(mirror, revision)
        if commit is None or not mirrors.copy_kept(mirror, commit, self.dirs.repo):
            return False
        self.commit = commit
        self.log(f"checked out commit {commit} (a copy of this node's earlier checkout)")
        return True

    def find_requirements(self) -> Path:
        relative = self.spec.requirements_path
        repo = self.dirs.repo.resolve()
        path = (repo / relative).resolve()
        if not path.is_relative_to(repo) or not path.is_file():
            raise BuildFailed(
                "requirements_not_found",
                f"requirements file '{relative}' not found at the repository root of revision "
                f"{self.commit}; add it or pass --requirements-path",
                self.commit,
            )
        return path

    def prepare_environment(self, requirements: Path) -> None:
        """The job's virtual environment: a view of the node's cached one for these
        requirements, else (no cache, or requirements naming local files) its own."""
        if self.caches is None or not is_cacheable(requirements.read_bytes()):
            if self.caches is not None:
                self.log("environment: not cached (the requirements name local paths or files)")
            self.create_venv()
            self.install(requirements)
        else:
            step = CachedEnvironment(requirements, self.spec.requirements_path, self.python,
                                     self._run_jobs_code, self.log, self.as_user)  # fmt: skip
            try:
                step.provide(self.caches.envs, self.dirs.venv, self.cancel)
            except EnvironmentFailed as error:
                raise BuildFailed("dependency_install_failed", str(error), self.commit) from None
            except LockCancelled:
                raise BuildCancelled() from None
        if self.site_packages:
            added = add_host_site_packages(self.dirs.venv, python_info(self.python), self.as_user)
            self.log(f"environment: also sees the packages of {self.python} ({', '.join(added)})")

    def create_venv(self) -> None:
        self.log("creating the virtual environment")
        code, tail = self._run_jobs_code(
            [self.python, "-m", "venv", "--without-pip", str(self.dirs.venv)], self.dirs.root
        )
        if code != 0:
            raise BuildFailed(
                "dependency_install_failed",
                f"cannot create the virtual environment: {tail}",
                self.commit,
            )

    def install(self, requirements: Path) -> None:
        if not has_requirements(requirements):
            self.log(f"no requirements in {self.spec.requirements_path}, nothing to install")
            return
        self.log(f"installing {self.spec.requirements_path}")
        pip = [self.python, "-m", "pip", "--python", str(self.dirs.venv_python), "install"]
        argv = [*pip, "--disable-pip-version-check", "--no-input", "-r", str(requirements)]
        code, tail = self._run_jobs_code(argv, self.dirs.repo)
        if code != 0:
            raise BuildFailed(
                "dependency_install_failed",
                f"dependency installation failed: {tail}",
                self.commit,
            )

    def link_datasets(self) -> None:
        try:
            provide_datasets(self.spec, self.dirs.input, log=self.log, cache=self.dataset_cache,
                             local_dir=self.datasets_dir)  # fmt: skip
        except DatasetUnavailable as error:
            raise BuildFailed(error.code, str(error), self.commit) from None

    def unpack_input_checkpoint(self) -> None:
        checkpoint_id = self.input_checkpoint_id
        if not checkpoint_id:
            return
        archive = self.dirs.scratch / "input-checkpoint.zip"
        try:
            if self.fetch_checkpoint is None:
                raise CheckpointMissing(checkpoint_id)
            self.fetch_checkpoint(checkpoint_id, archive)
            unpack(archive, self.dirs.input_checkpoint, UnpackLimits(), "the checkpoint")
        except CheckpointMissing as error:
            raise BuildFailed(
                "checkpoint_not_found",
                f"checkpoint {checkpoint_id} could not be fetched from the control plane "
                f"({error or 'not found'}); check --checkpoint",
                self.commit,
            ) from None
        except ArchiveRefused as error:
            raise BuildFailed(
                "checkpoint_invalid",
                f"checkpoint {checkpoint_id} was not unpacked: {error}; start from another "
                "checkpoint (--checkpoint)",
                self.commit,
            ) from None
        finally:
            archive.unlink(missing_ok=True)
        self.log(f"checkpoint {checkpoint_id} unpacked into {self.dirs.input_checkpoint}")

    # -- helpers -------------------------------------------------------------------------

    def _resolve(self, revision: str) -> str | None:
        if revision.startswith("-"):
            return None
        for candidate in (f"refs/remotes/origin/{revision}", f"refs/tags/{revision}", revision):
            commit = self._rev_parse(candidate)
            if commit:
                return commit
        return None

    def _rev_parse(self, name: str) -> str | None:
        lines: list[str] = []
        code = run_command(
            ["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
            cwd=self.dirs.repo,
            env=_git_env(),
            on_line=lines.append,
            cancel=self.cancel,
        )
        if code is None:
            raise BuildCancelled()
        return lines[0].strip() if code == 0 and lines else None

    def _clone(self, url: str) -> tuple[int, str]:
        """``git clone --no-checkout`` into the job's repo, through the node's mirror if any."""
        if self.caches is None:
            return self._git(["clone", "--no-checkout", "--", url, str(self.dirs.repo)])
        try:
            self.caches.mirrors.clone(
                url, self.dirs.repo, git=self._git_lines, cancel=self.cancel, asked=self.asked
            )
        except MirrorFailed as error:
            return 1, str(error)
        except LockCancelled:
            raise BuildCancelled() from None
        return 0, ""

    def _git_lines(self, args: Sequence[str], cwd: Path) -> tuple[int, list[str]]:
        """Run git; its output goes to the log (but what ``ls-remote`` lists), and back."""
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line)
            if args[0] != "ls-remote":
                self.log(line)

        code = run_command(["git", *args], cwd=cwd, env=_git_env(), on_line=on_line,
                           cancel=self.cancel)  # fmt: skip
        if code is None:
            raise BuildCancelled()
        return code, lines

    def _git(self, args: Sequence[str], cwd: Path | None = None) -> tuple[int, str]:
        return self._run(["git", *args], cwd or self.dirs.root, _git_env())

    def _run_jobs_code(self, argv: Sequence[str], cwd: Path) -> tuple[int, str]:
        """A step that runs code of the job's: as the job's user, in the job's environment
        (and sandbox). Run outside the job's folder (a cached environment's staging folder),
        it may write where it runs."""
        writable = () if cwd.is_relative_to(self.dirs.root) else (cwd,)
        return self._run(argv, cwd, build_environment(self.dirs), self.as_user, writable)

    def _run(
        self,
        argv: Sequence[str],
        cwd: Path,
        env: dict[str, str],
        as_user: JobUser | None = None,
        writable: Sequence[Path] = (),
    ) -> tuple[int, str]:
        """Run a build command, its output into the log; return its code and last lines."""
        recent: deque[str] = deque(maxlen=40)

        def on_line(line: str) -> None:
            self.log(line)
            if line.strip():
                recent.append(line.strip())

        code = run_command(argv, cwd=cwd, env=env, on_line=on_line, cancel=self.cancel,
                           as_user=as_user, writable=writable)  # fmt: skip
        if code is None:
            raise BuildCancelled()
        return code, _summary(recent)


def _summary(lines: deque[str], limit: int = 800) -> str:
    """The lines that say what went wrong: pip's and git's ``ERROR``/``fatal`` lines if any."""
    errors = [line for line in lines if line.startswith(("ERROR", "error:", "fatal:"))]
    chosen = errors[-5:] if errors else list(lines)[-5:]
    text = " ".join(chosen)
    return text if len(text) <= limit else "..." + text[-limit:]


def _git_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"  # a private repository fails instead of waiting for input
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    env["LC_ALL"] = "C"
    # Only these transports, whatever the URL: never a transport helper (``ext::sh -c ...``
    # runs a command, ``fd::`` reads a descriptor) nor ``git-remote-<scheme>`` of an unknown
    # scheme. It stands for ``protocol.allow=never`` plus ``protocol.<name>.allow=always``.
    env["GIT_ALLOW_PROTOCOL"] = GIT_PROTOCOLS
    return env


GIT_PROTOCOLS = "file:git:http:https:ssh"
"""The transports git may use for a job's repository (the server chooses among them)."""
