"""Helpers shared by the unit and end-to-end tests: real git repositories, minimal wheels,
and process checks (the fake HTTP server: tests/fake_http.py)."""

from __future__ import annotations

import base64
import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# --- git --------------------------------------------------------------------------------------

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Ada",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(repo: Path | str, *args: str) -> str:
    """Runs ``git args`` in ``repo`` with a fixed identity; its stdout, stripped."""
    result = subprocess.run(
        ["git", "-C", str(repo), *args],
        env={**os.environ, **GIT_ENV},
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


def make_repo(path: Path, files: dict[str, str]) -> Path:
    """A real git repository holding ``files`` (dedented) in one commit on branch main."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "training code")
    return path


def job_repo(root: Path, train_py: str) -> Path:
    """``root/origin``: a job's repository, ``train.py`` and an empty requirements.txt."""
    return make_repo(root / "origin", {"train.py": train_py, "requirements.txt": ""})


# --- wheels -----------------------------------------------------------------------------------


def build_wheel(
    directory: Path, name: str, version: str, source: str, *, package: bool = False
) -> Path:
    """A real, minimal pure-Python wheel, so pip installs dependencies without an index.

    ``source`` becomes the module ``name.py``, or ``name/__init__.py`` with ``package``.
    """
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py" if package else f"{name}.py": source,
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        ),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def unzip(archive: Path) -> dict[str, bytes]:
    """Every file of a zip archive, by its name."""
    with zipfile.ZipFile(archive) as bundle:
        return {info.filename: bundle.read(info) for info in bundle.infolist()}


# --- the agent's upload protocol, through a test client --------------------------------------


def send_archive(client: Any, headers: dict[str, str], job_id: str, node_id: str, data: bytes,
                 *, name: str | None = None, node_index: int = 0) -> Any:  # fmt: skip
    """Upload ``data`` as an agent does (a session, each part to its target, complete): a
    checkpoint named ``name``, else node ``node_index``'s output. The last answer: the
    completion's, or the first refusal on the way."""
    import httpx

    begun = client.post(f"/v1/agent/jobs/{job_id}/uploads", headers=headers, json={
        "kind": "output" if name is None else "checkpoint", "name": name, "node_id": node_id,
        "node_index": node_index, "size_hint": len(data)})  # fmt: skip
    if begun.status_code != 201:
        return begun
    upload_id, size = begun.json()["id"], begun.json()["part_size"]
    pieces = [data[start : start + size] for start in range(0, len(data), size)] or [b""]
    asked = client.post(f"/v1/agent/uploads/{upload_id}/parts", headers=headers,
                        json={"numbers": list(range(1, len(pieces) + 1))})  # fmt: skip
    if asked.status_code != 200:
        return asked
    parts = []
    for target, piece in zip(asked.json()["parts"], pieces, strict=True):
        if target["url"].startswith("/"):
            sent = client.put(target["url"], headers=headers, content=piece)
            etag = sent.json().get("etag") if sent.status_code == 200 else None
        else:  # the store itself, presigned: no token goes there
            sent = httpx.put(target["url"], headers=target["headers"], content=piece)
            etag = sent.headers.get("ETag")
        if sent.status_code != 200:
            return sent
        parts.append({"number": target["number"], "etag": etag})
    return client.post(f"/v1/agent/uploads/{upload_id}/complete", headers=headers, json={
        "parts": parts, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})


# --- processes --------------------------------------------------------------------------------

# A leader and two children, all ignoring SIGTERM; each prints "PID <its pid>".
STUBBORN_GROUP = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
child += "os.write(1, b'PID %d\\\\n' % os.getpid()); time.sleep(600)"
for _ in range(2):
    subprocess.Popen([sys.executable, "-c", child])
os.write(1, b"PID %d\\n" % os.getpid())  # one write: the three processes share the pipe
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def job_pids(job_id: str) -> list[int]:
    """The live processes on this host whose environment holds job ``job_id``'s marker (the
    agent's ``FLEXAI_JOB_MARKER``, ``...:<job_id>:<node_index>``), by their pids here: the
    job's processes, in a sandbox (where they have pids of their own) or not."""
    wanted = f":{job_id}:".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        marked = any(entry.startswith(b"FLEXAI_JOB_MARKER=") and wanted in entry
                     for entry in environ)  # fmt: skip
        if marked and alive(int(name)):
            found.append(int(name))
    return found


def wait_until(
    condition: Callable[[], object], timeout: float = 20.0, why: Callable[[], str] | None = None
) -> None:
    """Waits for ``condition`` to hold; fails the test after ``timeout`` seconds, saying
    ``why()`` (what the test saw instead) where it is given."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out" + (f":\n{why()}" if why else "")
        time.sleep(0.02)


# --- another user ---------------------------------------------------------------------------


def python_for_user(name: str) -> str | None:
    """An interpreter user ``name`` can run, with venv and pip, to make jobs' virtual
    environments (the tests' own may sit in a home only its owner enters); None if none."""
    from node_agent.run.jobuser import job_user, python_for

    return python_for(job_user(name))


def can_run_jobs_as(name: str) -> str:
    """Why jobs cannot run as user ``name`` here, or "" when they can."""
    if os.geteuid() != 0:
        return "running jobs as another user needs root"
    try:
        pwd.getpwnam(name)
    except KeyError:
        return f"there is no user {name} on this host"
    return ""


@contextmanager
def world_readable_directory() -> Iterator[Path]:
    """A temporary directory every user may enter (pytest's are their owner's alone)."""
    path = Path(tempfile.mkdtemp(prefix="flexai-open-"))
    path.chmod(0o755)
    try:
        yield path.resolve()
    finally:
        shutil.rmtree(path, ignore_errors=True)


# The test oracle, written from SPEC.md's "Allowed transitions" table row by row (not taken
# from the code, so a wrong table in the code is caught).
SPEC_TRANSITIONS = {
    ("pending", "scheduling"),
    ("scheduling", "building"),
    ("scheduling", "rejected"),
    ("building", "in progress"),
    ("building", "enqueued"),
    ("building", "failed"),
    ("enqueued", "in progress"),
    ("enqueued", "scheduling"),
    ("in progress", "succeeded"),
    ("in progress", "failed"),
    ("pending", "stop in progress"),
    ("scheduling", "stop in progress"),
    ("building", "stop in progress"),
    ("enqueued", "stop in progress"),
    ("in progress", "stop in progress"),
    ("stop in progress", "stopped"),
    ("stop in progress", "stop failed"),
    ("in progress", "enqueued"),
    ("in progress", "scheduling"),
    ("building", "scheduling"),
}
SPEC_TERMINAL = frozenset({"rejected", "succeeded", "failed", "stopped", "stop failed"})


def node_headers(services: Any, node: str, agent_id: str | None = None) -> dict[str, str]:
    """The headers of node ``node``'s agent: a node token an admin made for it (the agent
    routes refuse users' tokens), and the agent's id when given."""
    issued = services.identities.issue_node_token(node, label="test", by="admin")
    headers = {"Authorization": f"Bearer {issued.token}"}
    if agent_id is not None:
        headers["X-Flexai-Agent-Id"] = agent_id
    return headers


def user_headers(services: Any, user: str, *, admin: bool = False) -> dict[str, str]:
    """The headers of a new user ``user`` (made with its first token)."""
    issued = services.identities.create_user(user, admin=admin, by="admin")
    return {"Authorization": f"Bearer {issued.token}"}
