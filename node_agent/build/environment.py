"""The build step that gives a job its Python environment from the node's cache.

The job's ``venv/`` is a view of the cached environment for its requirements
(:mod:`node_agent.build.envcache`); the first job that needs one builds it, as the job's user, with
``uv`` when that user can run it (pip's index settings passed on), else with ``venv`` and pip.
Their output goes to the job's log; a cached environment says so in one line.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from node_agent.build.envcache import (
    EnvCache,
    environment_key,
    find_uv,
    make_view,
    python_info,
    uv_index_flags,
)
from node_agent.run.jobuser import JobUser

Run = Callable[[Sequence[str], Path], tuple[int, str]]
"""Run a command of the job's (as its user); return its exit code and what it said last."""


class EnvironmentFailed(Exception):
    """The environment could not be built; the message says what the installer said."""


@dataclass(frozen=True)
class CachedEnvironment:
    requirements: Path
    requirements_name: str
    python: str
    run: Run
    log: Callable[[str], None]
    user: JobUser | None

    def provide(self, envs: EnvCache, venv: Path, cancel: threading.Event) -> None:
        """``venv``: a view of the cached environment, built first if no job built it yet."""
        python = python_info(self.python)
        key = environment_key(self.requirements.read_bytes(), python, os.environ)
        short = key[:12]
        if not envs.path(key).is_dir():
            self.log(f"environment: not cached yet, building it (key {short})")
        cached, built = envs.get(key, self._build, cancel=cancel, user=self.user)
        make_view(cached, venv, python, self.user)
        said = "built and cached for the next jobs" if built else "cached"
        self.log(f"environment: {said} (key {short})")

    def _build(self, venv: Path) -> None:
        uv = uv_for(self.user)
        flags = uv_index_flags(os.environ) if uv else None
        if uv and flags is not None:
            self._check(self.run([uv, "venv", "--quiet", "--python", self.python, str(venv)],
                                 venv.parent), "create the virtual environment")  # fmt: skip
            install = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), *flags]
        else:
            self._check(self.run([self.python, "-m", "venv", "--without-pip", str(venv)],
                                 venv.parent), "create the virtual environment")  # fmt: skip
            install = [self.python, "-m", "pip", "--python", str(venv / "bin" / "python"),
                       "install", "--disable-pip-version-check", "--no-input"]  # fmt: skip
        if not has_requirements(self.requirements):
            self.log(f"no requirements in {self.requirements_name}, nothing to install")
            return
        self.log(f"installing {self.requirements_name}" + (" with uv" if install[0] == uv else ""))
        self._check(self.run([*install, "-r", str(self.requirements)], venv.parent), "install")

    @staticmethod
    def _check(result: tuple[int, str], what: str) -> None:
        code, tail = result
        if code != 0:
            if what == "install":
                raise EnvironmentFailed(f"dependency installation failed: {tail}")
            raise EnvironmentFailed(f"cannot {what}: {tail}")


def has_requirements(path: Path) -> bool:
    """Whether a requirements file names anything (comments and blank lines do not count)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.split("#", 1)[0].strip():
            return True
    return False


def uv_for(user: JobUser | None) -> str | None:
    """``uv``, if the job's user can run it."""
    found = find_uv()
    if found is None:
        return None
    return found if _runs(found, user.uid if user else None, user.gid if user else None) else None


@cache
def _runs(program: str, uid: int | None, gid: int | None) -> bool:
    as_user: dict[str, Any] = {}
    if uid is not None and uid != os.geteuid():
        as_user = {"user": uid, "group": gid, "extra_groups": []}
    try:
        answer = subprocess.run([program, "--version"], capture_output=True, timeout=30, cwd="/",
                                **as_user)  # fmt: skip
        return answer.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
