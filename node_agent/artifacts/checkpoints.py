"""Checkpoints: each direct child of ``output-checkpoint/`` becomes one, uploaded as a zip.

While the job runs a child is uploaded once it has stopped changing (no file added, resized or
touched) for ``stable_for`` seconds; when the job ends :meth:`CheckpointWatcher.finish`
uploads whatever is left. Names starting with ``.`` or ``tmp-`` are work in progress (the
Hugging Face trainer writes ``tmp-checkpoint-N`` and renames it) and are never uploaded.
An upload waits for the store as long as it takes (:mod:`node_agent.artifacts.uploader`):
a checkpoint is never dropped because the store or the control plane is away.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from node_agent.artifacts.uploader import Artifact, ArtifactUploader
from node_agent.client import ApiError, ApiUnavailable

log = logging.getLogger("flexai.agent")

Signature = tuple[int, int, int]


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
    """Watches one job's checkpoint directory and uploads each checkpoint once."""

    def __init__(
        self,
        uploader: ArtifactUploader,
        job_id: str,
        node_id: str,
        directory: Path,
        *,
        stable_for: float = 1.0,
        interval: float = 0.5,
        on_upload: Callable[[str], None] | None = None,
        node_index: int = 0,
    ) -> None:
        self.uploader = uploader
        self.job_id = job_id
        self.node_id = node_id
        self.node_index = node_index
        self.directory = directory
        self.stable_for = stable_for
        self.interval = interval
        self.on_upload = on_upload
        self.uploaded: list[str] = []
        self._settled: set[str] = set()  # uploaded, or refused for good
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
        """Stop watching and upload every checkpoint not uploaded yet."""
        self.stop_watching()
        self.scan(final=True)

    def scan(self, final: bool = False) -> None:
        for child in self._candidates():
            if final or self._is_stable(child):
                self._upload(child)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.scan()
            except Exception:  # the watcher must outlive any one bad scan
                log.exception("job %s: checkpoint scan failed", self.job_id)

    def _candidates(self) -> list[Path]:
        try:
            children = [
                child
                for child in self.directory.iterdir()
                if child.name not in self._settled and not child.name.startswith((".", "tmp-"))
            ]
        except FileNotFoundError:
            return []
        return sorted(children, key=_mtime)

    def _is_stable(self, child: Path) -> bool:
        try:
            current = signature(child)
        except OSError:
            return False
        now = time.monotonic()
        previous = self._seen.get(child.name)
        if previous is None or previous[0] != current:
            self._seen[child.name] = (current, now)
            return False
        empty_folder = child.is_dir() and current[0] == 0
        return not empty_folder and now - previous[1] >= self.stable_for

    def _upload(self, child: Path) -> None:
        name = child.name
        artifact = Artifact(self.job_id, "checkpoint", name, self.node_id, self.node_index,
                            child, trusted=self.directory.parent)  # fmt: skip
        try:
            self.uploader.upload(artifact)
        except ApiUnavailable as error:  # the agent shuts down: its restart uploads it
            log.warning("job %s: checkpoint %s not uploaded yet: %s", self.job_id, name, error)
            return
        except (ApiError, OSError) as error:
            log.error("job %s: checkpoint %s not uploaded: %s", self.job_id, name, error)
            self._settled.add(name)
            return
        self._settled.add(name)
        self.uploaded.append(name)
        if self.on_upload is not None:
            self.on_upload(name)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
