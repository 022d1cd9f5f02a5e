"""The artifact store: job logs, checkpoints and outputs as files under the data directory."""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz", ".gguf", ".onnx", ".ckpt")


class LogOffsetMismatch(Exception):
    def __init__(self, expected: int) -> None:
        self.expected = expected
        super().__init__(
            f"log bytes must continue at offset {expected}; resend from there"
        )


class InvalidArchive(Exception):
    pass


class LocalArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._log_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    def _job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    # -- logs -----------------------------------------------------------------------------

    def _log_path(self, job_id: str) -> Path:
        return self._job_dir(job_id) / "logs.txt"

    def log_size(self, job_id: str) -> int:
        path = self._log_path(job_id)
        return path.stat().st_size if path.exists() else 0

    def append_log(self, job_id: str, offset: int, data: bytes) -> int:
        """Append bytes that start at ``offset``; bytes already held are not written twice."""
        with self._log_locks[job_id]:
            size = self.log_size(job_id)
            if offset > size:
                raise LogOffsetMismatch(size)
            fresh = data[size - offset :]
            if fresh:
                path = self._log_path(job_id)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("ab") as handle:
                    handle.write(fresh)
                    handle.flush()
                    os.fsync(handle.fileno())
            return size + len(fresh)

    def read_log(self, job_id: str, offset: int, limit: int = 1 << 20) -> bytes:
        path = self._log_path(job_id)
        if not path.exists():
            return b""
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(limit)

    # -- checkpoints and outputs ----------------------------------------------------------

    def checkpoint_path(self, job_id: str, checkpoint_id: str) -> Path:
        return self._job_dir(job_id) / "checkpoints" / f"{checkpoint_id}.zip"

    def save_checkpoint(self, job_id: str, checkpoint_id: str, data: bytes) -> dict[str, Any]:
        """Store the checkpoint archive; return what it tells of the model."""
        metadata = describe_checkpoint(data)
        _write_atomically(self.checkpoint_path(job_id, checkpoint_id), data)
        return metadata

    def output_path(self, job_id: str, node_index: int) -> Path:
        return self._job_dir(job_id) / "outputs" / f"output_{node_index}.zip"

    def save_output(self, job_id: str, node_index: int, data: bytes) -> int:
        _open_archive(data)
        _write_atomically(self.output_path(job_id, node_index), data)
        return len(data)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def _open_archive(data: bytes) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        archive.namelist()
    except zipfile.BadZipFile as error:
        raise InvalidArchive(f"the upload is not a zip archive: {error}") from error
    return archive


def _read_json(archive: zipfile.ZipFile, names: list[str], file_name: str) -> dict[str, Any]:
    matches = sorted((name for name in names if Path(name).name == file_name), key=len)
    if not matches:
        return {}
    try:
        value = json.loads(archive.read(matches[0]))
    except (ValueError, KeyError):
        return {}
    return value if isinstance(value, dict) else {}


def _last_with(entries: list[Any], key: str) -> Any:
    for entry in reversed(entries):
        if isinstance(entry, dict) and key in entry:
            return entry[key]
    return None


def describe_checkpoint(data: bytes) -> dict[str, Any]:
    """Step and losses from trainer_state.json, model and version from config.json."""
    archive = _open_archive(data)
    names = archive.namelist()
    state = _read_json(archive, names, "trainer_state.json")
    config = _read_json(archive, names, "config.json")
    history = state.get("log_history") or []
    history = history if isinstance(history, list) else []
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    architectures = config.get("architectures") or []
    has_weights = any(name.endswith(WEIGHT_SUFFIXES) for name in names)
    return {
        "size": sum(info.file_size for info in archive.infolist()),
        "step": last.get("step", state.get("global_step")),
        "train_loss": _last_with(history, "loss"),
        "eval_loss": _last_with(history, "eval_loss"),
        "model": architectures[0] if isinstance(architectures, list) and architectures else None,
        "version": config.get("transformers_version"),
        "inference_ready": bool(config) and has_weights,
    }
