"""Jobs' Python environments, built once per node and shared read-only.

An environment is keyed by the requirements file's bytes, the job Python (its path and
version) and the index settings pip would use. The first job that needs a key builds it (with
``uv`` when the job user can run it, else ``python -m venv`` and pip), as the job user, in a
staging directory; the agent then takes the result over (its files, read-only to every other
user) and renames it to ``<work-dir>/envs/<key>/``. A lock per key makes two jobs that need the
same key build it once. Each job then gets a cheap view of its own (:func:`make_view`): a
virtual environment whose ``site-packages`` adds the cached one behind its own, so what a job
pip-installs at run time goes into its own view, never into the cache. Environments are never
evicted: delete ``<work-dir>/envs/`` while the agent is stopped to reclaim the space.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from node_agent.build.filelock import FileLock
from node_agent.run.jobuser import JobUser

_PROBE = (
    "import json, sys; print(json.dumps({'base': sys._base_executable, 'version': sys.version,"
    " 'major': sys.version_info[0], 'minor': sys.version_info[1]}))"
)
_PIP_SETTINGS_UV_TAKES = {
    "PIP_NO_INDEX": "--no-index",
    "PIP_FIND_LINKS": "--find-links",
    "PIP_INDEX_URL": "--index-url",
    "PIP_EXTRA_INDEX_URL": "--extra-index-url",
}
_PIP_SETTINGS_WITHOUT_EFFECT = {
    "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INPUT", "PIP_PROGRESS_BAR", "PIP_ROOT_USER_ACTION",
    "PIP_NO_COLOR", "PIP_QUIET", "PIP_VERBOSE",
}  # fmt: skip
_PIP_CONFIG_FILES = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf")
_NOT_SCRIPTS = ("python", "activate", "Activate", "deactivate", "pydoc")
_LOCAL_REFERENCE = ("-e", "--editable", "-r", "--requirement", "-c", "--constraint", ".", "/")


@dataclass(frozen=True)
class Python:
    """The interpreter jobs' environments are made from."""

    path: str
    base: str
    """The interpreter behind it (itself, unless it is a virtual environment's)."""
    version: str
    major: int
    minor: int

    @property
    def site_packages(self) -> str:
        """Where a virtual environment of this Python keeps packages, from its root."""
        return f"lib/python{self.major}.{self.minor}/site-packages"


@cache
def python_info(path: str) -> Python:
    """What ``path`` is (asked once per interpreter)."""
    answer = subprocess.run(
        [path, "-I", "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    facts = json.loads(answer.stdout)
    return Python(path, facts["base"], facts["version"], facts["major"], facts["minor"])


_SITE_PROBE = "import json, site; print(json.dumps(site.getsitepackages()))"
HOST_SITE_PTH = "_flexai_job_site_packages.pth"
"""The ``.pth`` file (after ``_flexai_cached_env.pth``) that ``--job-site-packages`` adds."""


@cache
def host_site_packages(path: str) -> tuple[str, ...]:
    """The ``site-packages`` directories of the interpreter at ``path`` itself (for a virtual
    environment's: that environment's), e.g. where a GPU host's PyTorch is installed."""
    answer = subprocess.run(
        [path, "-I", "-c", _SITE_PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    return tuple(folder for folder in json.loads(answer.stdout) if os.path.isdir(folder))


def add_host_site_packages(venv: Path, python: Python, user: JobUser | None) -> tuple[str, ...]:
    """``--job-site-packages``: the job's environment also sees the packages installed for
    ``python``, behind its own and its cached ones (a ``.pth`` file that sorts after theirs);
    return the directories added."""
    folders = host_site_packages(python.path)
    pth = venv / python.site_packages / HOST_SITE_PTH
    pth.write_text("".join(f"import site; site.addsitedir({f!r})\n" for f in folders))
    if user is not None and not user.is_agent:
        os.chown(pth, user.uid, user.gid)
    return folders


def environment_key(requirements: bytes, python: Python, environ: Mapping[str, str]) -> str:
    """The cache key: what decides what an install of ``requirements`` gives."""
    digest = hashlib.sha256(b"flexai-env-1\0")
    for part in (python.path, python.version, *sorted(_index_settings(environ).items())):
        digest.update(f"{part}\0".encode())
    digest.update(hashlib.sha256(requirements).digest())
    return digest.hexdigest()


def is_cacheable(requirements: bytes) -> bool:
    """False when the file names local paths or other files, whose content the key misses."""
    for raw in requirements.decode(errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith("#"):
            continue
        if line.startswith(_LOCAL_REFERENCE) or "file:" in line:
            return False
    return True


def find_uv() -> str | None:
    """``uv`` on the PATH, else beside the agent's own interpreter (its virtual environment)."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    return str(Path(found).resolve()) if found else None


def uv_index_flags(environ: Mapping[str, str]) -> list[str] | None:
    """pip's index settings as ``uv pip install`` flags; None when pip has settings (a config
    file, other ``PIP_*`` variables) that uv would not honour: then pip builds."""
    if environ.get("PIP_CONFIG_FILE") or any(Path(p).exists() for p in _PIP_CONFIG_FILES):
        return None
    flags: list[str] = []
    for name, value in environ.items():
        if not name.startswith("PIP_") or name in _PIP_SETTINGS_WITHOUT_EFFECT:
            continue
        flag = _PIP_SETTINGS_UV_TAKES.get(name)
        if flag is None:
            return None
        if flag == "--no-index":
            flags += [flag] if value.lower() not in ("", "0", "false", "no", "off") else []
        else:
            flags += [part for item in value.split() for part in (flag, item)]
    return flags


def _index_settings(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in _PIP_SETTINGS_UV_TAKES}


Build = Callable[[Path], None]
"""Build a virtual environment at the given path (which does not exist yet)."""


class EnvCache:
    """``<work-dir>/envs/``: one read-only environment per key, each built once."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        return self.root / key

    def get(
        self, key: str, build: Build, *, cancel: threading.Event, user: JobUser | None
    ) -> tuple[Path, bool]:
        """The environment of ``key``, and whether this call built it."""
        final = self.path(key)
        if final.is_dir():
            return final, False
        self._prepare_root(user)
        with FileLock(self.root / f".{key}.lock", cancel):
            if final.is_dir():  # built by another job while this one waited
                return final, False
            staging = self.root / f".build-{key[:16]}-{secrets.token_hex(4)}"
            staging.mkdir(mode=0o700)
            try:
                if user is not None and not user.is_agent:
                    os.chown(staging, user.uid, user.gid)
                build(staging / "venv")
                point_scripts_at(staging / "venv", final)
                _take_over(staging / "venv")
                os.rename(staging / "venv", final)
                _lock_down(str(final), os.geteuid(), os.getegid())  # after the move: a
                # directory without write access cannot move to another parent (its "..")
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return final, True

    def _prepare_root(self, user: JobUser | None) -> None:
        """The job user may pass through ``envs/`` (to read its environment), not list it."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711 if user is not None and not user.is_agent else 0o755)

def _take_over(venv: Path) -> None:
    """What the built environment holds becomes the agent's, readable by all and writable by
    none (the agent is root, or the job user itself: then the modes guard against slips)."""
    uid, gid = os.geteuid(), os.getegid()
    for folder, subfolders, files in os.walk(venv, topdown=False):
        for name in (*files, *subfolders):
            _lock_down(os.path.join(folder, name), uid, gid)


def _lock_down(path: str, uid: int, gid: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    status = os.lstat(path)
    if os.path.islink(path):
        return
    mode = status.st_mode & 0o777
    readable = 0o555 if os.path.isdir(path) or mode & 0o111 else 0o444
    os.chmod(path, readable)


def make_view(cached: Path, venv: Path, python: Python, user: JobUser | None) -> None:
    """The job's own virtual environment at ``venv``, layered on the cached one: its own
    ``site-packages`` first, then the cache's (added by a ``.pth`` file, so the cache's own
    ``.pth`` files work too), and the cache's scripts, run by the job's interpreter."""
    site = venv / python.site_packages
    site.mkdir(parents=True)
    (venv / "lib64").symlink_to("lib")
    bin_dir = venv / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(python.base)
    for alias in ("python3", f"python{python.major}.{python.minor}"):
        (bin_dir / alias).symlink_to("python")
    (venv / "pyvenv.cfg").write_text(
        f"home = {Path(python.base).parent}\ninclude-system-site-packages = false\n"
        f"version = {python.version.split()[0]}\nexecutable = {os.path.realpath(python.base)}\n"
    )
    layered = cached / python.site_packages
    (site / "_flexai_cached_env.pth").write_text(
        f"import site; site.addsitedir({str(layered)!r})\n"
    )
    _copy_scripts(cached / "bin", bin_dir, old=str(cached / "bin" / "python"))
    if user is not None and not user.is_agent:
        for folder, subfolders, files in os.walk(venv):
            for name in (*subfolders, *files):
                os.chown(os.path.join(folder, name), user.uid, user.gid, follow_symlinks=False)
        os.chown(venv, user.uid, user.gid)


def _copy_scripts(source: Path, target: Path, *, old: str) -> None:
    """The cache's console scripts, their interpreter changed to the view's."""
    new = str(target / "python")
    for script in source.iterdir():
        if script.name.startswith(_NOT_SCRIPTS) or script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(b"#!"):
            data = data.replace(old.encode(), new.encode())
        copy = target / script.name
        copy.write_bytes(data)
        copy.chmod(0o755 if os.access(script, os.X_OK) else 0o644)


def point_scripts_at(venv: Path, final: Path) -> None:
    """After a build at a staging path: the scripts name the environment's final path."""
    old, new = str(venv / "bin" / "python"), str(final / "bin" / "python")
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(b"#!") and old.encode() in data:
            script.write_bytes(data.replace(old.encode(), new.encode()))
