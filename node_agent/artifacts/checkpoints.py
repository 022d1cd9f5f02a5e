"""Checkpoints: each folder directly in ``output-checkpoint/`` becomes one, uploaded as a zip;
the files directly in it (where the Hugging Face Trainer saves its final model) make one more,
named ``""`` (the job's final checkpoint, as FlexAI names it), uploaded when the job ends.

While the job runs a child is uploaded once it has stopped changing (no file added, resized or
touched) for ``stable_for`` seconds; when the job ends :meth:`CheckpointWatcher.finish`
uploads whatever is left. Names starting with ``.`` or ``tmp-`` are work in progress (the
Hugging Face trainer writes ``tmp-checkpoint-N`` and renames it) and are never uploaded: a
checkpoint renamed into place is taken whole.
A checkpoint that changes after it was uploaded (written in stages, with a pause longer than
``stable_for`` between them) is uploaded again, once it is still again, as ``NAME.v2``
(``.v3``...), and the job's log says so: the newest is then the whole one. Each is looked at
for ``recheck_for`` seconds after its upload, and once more when the job ends. What was uploaded
is kept in ``record`` (the agent's scratch folder of the job), so that the watcher of an agent
that restarted while the job ran knows it too: a checkpoint changed while the agent was down is
uploaded again as well, and one that did not change is not offered again.
An upload waits for the store as long as it takes (:mod:`node_agent.artifacts.uploader`):
a checkpoint is never dropped because the store or the control plane is away.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node_agent.artifacts.uploader import Artifact, ArtifactUploader
from node_agent.client import ApiError, ApiUnavailable

log = logging.getLogger("flexai.agent")

Signature = tuple[int, int, int]
ROOT = ""
"""The root checkpoint's name: the files directly in the checkpoint folder."""
RECHECK_FOR = 300.0
"""Seconds after its upload a checkpoint is still looked at for changes, until the job ends."""


def signature(path: Path) -> Signature:
    """What changes whenever something is written under ``path``: count, bytes, newest mtime."""
    if path.is_symlink() or not path.is_dir():  # a link is not walked: it will not be zipped
        status = path.lstat()
        return (1, status.st_size, status.st_mtime_ns)
    count, size, newest = 0, 0, path.lstat().st_mtime_ns
    for folder, _subfolders, files in os.walk(path):
        newest = max(newest, os.lstat(folder).st_mtime_ns)
        for name in files:
            try:
                status = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            count, size = count + 1, size + status.st_size
            newest = max(newest, status.st_mtime_ns)
    return (count, size, newest)


class CheckpointWatcher:
    """Watches one job's checkpoint directory and uploads each checkpoint, again when it
    changed after its upload; ``say`` writes a line to the job's log."""

    def __init__(
        self,
        uploader: ArtifactUploader,
        job_id: str,
        node_id: str,
        directory: Path,
        *,
        stable_for: float = 1.0,
        interval: float = 0.5,
        recheck_for: float = RECHECK_FOR,
        on_upload: Callable[[str], None] | None = None,
        say: Callable[[str], None] | None = None,
        node_index: int = 0,
        record: Path | None = None,
    ) -> None:
        self.uploader = uploader
        self.job_id = job_id
        self.node_id = node_id
        self.node_index = node_index
        self.directory = directory
        self.stable_for = stable_for
        self.interval = interval
        self.recheck_for = recheck_for
        self.on_upload = on_upload
        self.say = say
        self.uploaded: list[str] = []
        """The names the checkpoints were uploaded as (``NAME.v2`` for a second one)."""
        self._refused: set[str] = set()  # refused for good
        self.record = record
        # uploaded, by name in the directory (by an earlier watcher too, in the record)
        self._taken = {} if record is None else _read_record(record, job_id)
        self._seen: dict[str, tuple[Signature, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"ckpt-{job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def finish(self) -> None:
        """Stop watching and upload every checkpoint not uploaded yet, or changed since."""
        self.stop_watching()
        self.scan(final=True)

    def scan(self, final: bool = False) -> None:
        if final:
            self._scan_root()
        for child in self._candidates(final):
            try:
                current = signature(child)
            except OSError:
                continue  # gone meanwhile (a trainer's rotation deletes old checkpoints)
            taken = self._taken.get(child.name)
            if taken is not None and taken.signature == current:
                continue
            if final or self._is_stable(child.name, current):
                self._upload(child, current, taken)

    def _scan_root(self) -> None:
        """The files directly in the folder, as the root checkpoint ``""``."""
        try:
            files = [entry for entry in os.scandir(self.directory)
                     if entry.is_file(follow_symlinks=False)
                     and not entry.name.startswith((".", "tmp-"))]  # fmt: skip
            current = (len(files), sum(entry.stat(follow_symlinks=False).st_size
                                       for entry in files),
                       max((entry.stat(follow_symlinks=False).st_mtime_ns for entry in files),
                           default=0))  # fmt: skip
        except OSError:
            return
        taken = self._taken.get(ROOT)
        if files and ROOT not in self._refused and (taken is None or taken.signature != current):
            self._upload(self.directory, current, taken, name=ROOT)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.scan()
            except Exception:  # the watcher must outlive any one bad scan
                log.exception("job %s: checkpoint scan failed", self.job_id)

    def _candidates(self, final: bool) -> list[Path]:
        """The children to look at: not temporary, not refused, and not uploaded more than
        ``recheck_for`` s ago (all of those once the job ended)."""
        since = time.monotonic() - self.recheck_for
        try:
            children = [
                child
                for child in self.directory.iterdir()
                if child.is_dir() and not child.is_symlink()
                and child.name not in self._refused
                and not child.name.startswith((".", "tmp-"))
                and (final or self._taken.get(child.name, _NEVER).at > since)
            ]
        except FileNotFoundError:
            return []
        return sorted(children, key=_mtime)

    def _is_stable(self, name: str, current: Signature) -> bool:
        now = time.monotonic()
        previous = self._seen.get(name)
        if previous is None or previous[0] != current:
            self._seen[name] = (current, now)
            return False
        empty_folder = current[0] == 0
        return not empty_folder and now - previous[1] >= self.stable_for

    def _upload(self, child: Path, current: Signature, taken: Taken | None,
                name: str | None = None) -> None:  # fmt: skip
        key = child.name if name is None else name
        name = key if taken is None else self._next_name(key, taken)
        artifact = Artifact(self.job_id, "checkpoint", name, self.node_id, self.node_index,
                            child, trusted=self.directory.parent,
                            top_files=key == ROOT)  # fmt: skip
        try:
            self.uploader.upload(artifact)
        except ApiUnavailable as error:  # the agent shuts down: its restart uploads it
            log.warning("job %s: checkpoint %s not uploaded yet: %s", self.job_id, name, error)
            return
        except (ApiError, OSError) as error:
            log.error("job %s: checkpoint %s not uploaded: %s", self.job_id, name, error)
            self._refused.add(key)
            return
        earlier = taken.names if taken is not None else ()
        self._taken[key] = Taken(current, time.monotonic(), (*earlier, name))
        self.uploaded.append(name)
        if self.record is not None:
            _write_record(self.record, self._taken, self.job_id)
        if taken is not None and self.say is not None:
            self.say(_changed_after_upload(key, taken.names[-1], name, self.stable_for))
        if self.on_upload is not None:
            self.on_upload(name)

    def _next_name(self, name: str, taken: Taken) -> str:
        """``NAME.vK`` for the K-th upload of a checkpoint, unless the job uses that name; a
        name too long to take the suffix loses as many of its last characters."""
        number = len(taken.names) + 1
        while os.path.lexists(self.directory / _versioned(name, number)):  # False if too long
            number += 1
        return _versioned(name, number)


@dataclass(frozen=True)
class Taken:
    """A checkpoint as it was last uploaded: its signature then, when (monotonic), and the
    names it was uploaded as."""

    signature: Signature
    at: float
    names: tuple[str, ...]


MAX_NAME = 255
"""The longest checkpoint name the control plane records (and a file name's on Linux)."""


def _versioned(name: str, number: int) -> str:
    suffix = f".v{number}"
    return name[: MAX_NAME - len(suffix)] + suffix


_NEVER = Taken((0, 0, 0), float("inf"), ())
"""What :meth:`CheckpointWatcher._candidates` takes a checkpoint not uploaded yet for."""


def _read_record(path: Path, job_id: str) -> dict[str, Taken]:
    """The checkpoints an earlier watcher of the job uploaded, each looked at again for
    ``recheck_for`` seconds from now; none if the record is missing or unreadable."""
    taken: dict[str, Taken] = {}
    try:
        data = json.loads(path.read_text())
        now = time.monotonic()
        for name, entry in data.items():
            count, size, newest = map(int, entry["signature"])
            taken[str(name)] = Taken((count, size, newest), now, tuple(map(str, entry["names"])))
        return taken
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        log.warning("job %s: checkpoint record %s unreadable (%s): each checkpoint is offered "
                    "again, and the control plane keeps those it holds", job_id, path, error)
        return {}


def _write_record(path: Path, taken: dict[str, Taken], job_id: str) -> None:
    """Replaced whole (a crash leaves the old one or the new one, never half of one)."""
    data = {name: {"signature": list(t.signature), "names": list(t.names)}
            for name, t in taken.items()}  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.part")
        partial.write_text(json.dumps(data))
        os.replace(partial, path)
    except OSError as error:
        log.warning("job %s: checkpoint record %s not written: %s", job_id, path, error)


def _changed_after_upload(name: str, before: str, now: str, stable_for: float) -> str:
    return (
        f"[agent] checkpoint {name} changed after it was uploaded as {before} (nothing had "
        f"changed in it for {stable_for:g} s): uploaded again, whole, as {now}. Write each "
        f"checkpoint under a name that starts with tmp- and rename it once complete, so it is "
        f"uploaded once"
    )


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
