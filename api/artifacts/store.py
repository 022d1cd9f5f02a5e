"""The artifact store: job logs, checkpoints and outputs as files under the data directory.

Uploads are received into a file beside their final place (never whole in memory), checked,
then renamed into place. A disk that refuses a write (permissions, full, read-only) raises
:class:`StorageUnavailable`, which the API answers with 503 so that agents retry.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
import zipfile
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from fastapi.concurrency import run_in_threadpool

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz", ".gguf", ".onnx", ".ckpt")
METADATA_MAX_BYTES = 16 * 2**20
"""``trainer_state.json`` and ``config.json`` larger than this are not read (a zip bomb's)."""
_WRITE_BUFFER = 2**20


class LogOffsetMismatch(Exception):
    def __init__(self, expected: int) -> None:
        self.expected = expected
        super().__init__(
            f"log bytes must continue at offset {expected}; resend from there"
        )


class InvalidArchive(Exception):
    pass


class ArchiveTooLarge(Exception):
    """An archive that would unpack to more files or bytes than the limits allow."""


class StorageUnavailable(Exception):
    def __init__(self, what: str, where: Path, error: OSError) -> None:
        reason = error.strerror or str(error)
        super().__init__(
            f"the control plane cannot store {what} right now ({reason} under {where}); "
            "nothing was lost: retry later (an operator must fix the artifact storage)"
        )


@dataclass(frozen=True)
class ArchiveLimits:
    max_entries: int = 100_000
    max_unpacked_bytes: int = 200 * 2**30


class LocalArtifactStore:
    def __init__(self, root: Path, limits: ArchiveLimits | None = None) -> None:
        self.root = root
        self.limits = limits or ArchiveLimits()
        self.root.mkdir(parents=True, exist_ok=True)
        self._log_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    def _job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    @contextmanager
    def _storing(self, what: str) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            raise StorageUnavailable(what, self.root, error) from error

    # -- logs -----------------------------------------------------------------------------

    def _log_path(self, job_id: str, node_index: int = 0) -> Path:
        """Each node of a job has its own log (node 0's keeps the single-node name)."""
        name = "logs.txt" if node_index == 0 else f"logs-{node_index}.txt"
        return self._job_dir(job_id) / name

    def log_size(self, job_id: str, node_index: int = 0) -> int:
        try:
            return self._log_path(job_id, node_index).stat().st_size
        except FileNotFoundError:
            return 0

    def append_log(self, job_id: str, offset: int, data: bytes, node_index: int = 0) -> int:
        """Append bytes that start at ``offset``; bytes already held are not written twice."""
        with self._log_locks[f"{job_id}/{node_index}"], self._storing("log bytes"):
            size = self.log_size(job_id, node_index)
            if offset > size:
                raise LogOffsetMismatch(size)
            fresh = data[size - offset :]
            if fresh:
                path = self._log_path(job_id, node_index)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("ab") as handle:
                    handle.write(fresh)
                    handle.flush()
                    os.fsync(handle.fileno())
            return size + len(fresh)

    def read_log(
        self, job_id: str, offset: int, limit: int = 1 << 20, node_index: int = 0
    ) -> bytes:
        try:
            handle = self._log_path(job_id, node_index).open("rb")
        except FileNotFoundError:
            return b""
        with handle, self._storing("log bytes"):
            if offset >= os.fstat(handle.fileno()).st_size:
                return b""  # never seek past the end: a file system refuses far offsets
            handle.seek(offset)
            return handle.read(limit)

    # -- checkpoints and outputs ----------------------------------------------------------

    def checkpoint_path(self, job_id: str, checkpoint_id: str) -> Path:
        return self._job_dir(job_id) / "checkpoints" / f"{checkpoint_id}.zip"

    def output_path(self, job_id: str, node_index: int) -> Path:
        return self._job_dir(job_id) / "outputs" / f"output_{node_index}.zip"

    async def receive(self, job_id: str, body: AsyncIterator[bytes]) -> Path:
        """Write an upload's body into a new file of the job's; the caller places or drops it."""
        return await self.receive_into(self._job_dir(job_id) / "uploads", body)

    async def receive_into(self, directory: Path, body: AsyncIterator[bytes]) -> Path:
        """Write an upload's body into a new file in ``directory``; the caller places or
        drops it."""
        with self._storing("uploads"):
            directory.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=directory, suffix=".partial")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as sink, self._storing("uploads"):
                pending = bytearray()
                async for chunk in body:
                    pending += chunk
                    if len(pending) >= _WRITE_BUFFER:
                        await run_in_threadpool(sink.write, bytes(pending))
                        pending.clear()
                await run_in_threadpool(sink.write, bytes(pending))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    def save_checkpoint(
        self, job_id: str, checkpoint_id: str, upload: bytes | Path
    ) -> dict[str, Any]:
        """Store the checkpoint archive; return what it tells of the model."""
        source = self._as_file(job_id, upload)
        try:
            metadata = describe_checkpoint(source, self.limits)
            self._place(source, self.checkpoint_path(job_id, checkpoint_id))
        finally:
            source.unlink(missing_ok=True)
        return metadata

    def save_output(self, job_id: str, node_index: int, upload: bytes | Path) -> int:
        source = self._as_file(job_id, upload)
        try:
            with open_archive(source, self.limits) as archive:
                refuse_unsafe_entries(archive, "the output directory")
            size = source.stat().st_size
            self._place(source, self.output_path(job_id, node_index))
        finally:
            source.unlink(missing_ok=True)
        return size

    def _as_file(self, job_id: str, upload: bytes | Path) -> Path:
        if isinstance(upload, Path):
            return upload
        directory = self._job_dir(job_id) / "uploads"
        with self._storing("uploads"):
            directory.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=directory, suffix=".partial")
            with os.fdopen(fd, "wb") as sink:
                sink.write(upload)
        return Path(name)

    def _place(self, source: Path, target: Path) -> None:
        with self._storing("uploads"):
            target.parent.mkdir(parents=True, exist_ok=True)
            source.replace(target)


def declared_entries(path: Path) -> int:
    """The entry count the archive's end record declares, read before the directory is parsed
    (a directory of millions of entries would take gigabytes to load)."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - (22 + 65535)))
        tail = handle.read()
        end = tail.rfind(b"PK\x05\x06")
        if end < 0 or len(tail) < end + 22:
            raise InvalidArchive("the upload is not a zip archive (no end of central directory)")
        count = int.from_bytes(tail[end + 10 : end + 12], "little")
        locator = tail.rfind(b"PK\x06\x07", 0, end)
        if count == 0xFFFF and locator >= 0:  # zip64: the real count is in the zip64 record
            record_at = int.from_bytes(tail[locator + 8 : locator + 16], "little")
            handle.seek(record_at)
            record = handle.read(56)
            if record[:4] == b"PK\x06\x06":
                count = int.from_bytes(record[32:40], "little")
        return count


@contextmanager
def open_archive(path: Path, limits: ArchiveLimits) -> Iterator[zipfile.ZipFile]:
    """A zip archive within the limits on entries and unpacked bytes."""
    entries = declared_entries(path)
    if entries > limits.max_entries:
        raise ArchiveTooLarge(
            f"the archive holds {entries} entries; at most {limits.max_entries} are accepted"
        )
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise InvalidArchive(f"the upload is not a zip archive: {error}") from error
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_entries:
            raise ArchiveTooLarge(
                f"the archive holds {len(infos)} entries; at most {limits.max_entries} are "
                "accepted"
            )
        unpacked = sum(info.file_size for info in infos)
        if unpacked > limits.max_unpacked_bytes:
            raise ArchiveTooLarge(
                f"the archive unpacks to {unpacked} bytes; at most {limits.max_unpacked_bytes} "
                "are accepted"
            )
        yield archive


def unsafe_entry(info: zipfile.ZipInfo, where: str = "the archive's directory") -> str | None:
    """Why an entry may not be unpacked into a directory of its own (zip-slip: a link, a
    special file, a name outside it), or None when it may."""
    name = info.filename
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "is a link or a special file"
    if "\\" in name or "\x00" in name or name.startswith("/"):
        return "has an absolute name, a backslash or a NUL byte"
    parts = PurePosixPath(name).parts
    if not parts or any(part in ("..", ".") for part in parts) or "//" in name:
        return f"leaves {where} ('..', '.' or an empty part)"
    return None


def refuse_unsafe_entries(archive: zipfile.ZipFile, what: str) -> None:
    """InvalidArchive naming the first entry that could land outside ``what`` when unpacked."""
    for info in archive.infolist():
        problem = unsafe_entry(info, f"{what}'s directory")
        if problem is not None:
            raise InvalidArchive(
                f"the archive's entry {info.filename[:100]!r} {problem}; send {what} as a zip "
                "of plain files and directories, each named inside it"
            )


def _read_json(archive: zipfile.ZipFile, file_name: str) -> dict[str, Any]:
    matches = sorted(
        (info for info in archive.infolist() if Path(info.filename).name == file_name),
        key=lambda info: len(info.filename),
    )
    if not matches or matches[0].file_size > METADATA_MAX_BYTES:
        return {}
    try:
        with archive.open(matches[0]) as member:
            value = json.loads(member.read(METADATA_MAX_BYTES + 1))
    except (ValueError, KeyError, zipfile.BadZipFile, NotImplementedError, RuntimeError,
            RecursionError, OSError):  # fmt: skip
        return {}
    return value if isinstance(value, dict) else {}


def _last_with(entries: list[Any], key: str) -> Any:
    for entry in reversed(entries):
        if isinstance(entry, dict) and key in entry:
            return entry[key]
    return None


def describe_checkpoint(
    source: bytes | Path, limits: ArchiveLimits | None = None
) -> dict[str, Any]:
    """Step and losses from trainer_state.json, model and version from config.json."""
    if isinstance(source, bytes):
        with tempfile.NamedTemporaryFile(suffix=".zip") as handle:
            handle.write(source)
            handle.flush()
            return describe_checkpoint(Path(handle.name), limits)
    with open_archive(source, limits or ArchiveLimits()) as archive:
        refuse_unsafe_entries(archive, "the checkpoint")
        infos = archive.infolist()
        state = _read_json(archive, "trainer_state.json")
        config = _read_json(archive, "config.json")
    history = state.get("log_history") or []
    history = history if isinstance(history, list) else []
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    architectures = config.get("architectures") or []
    has_weights = any(info.filename.endswith(WEIGHT_SUFFIXES) for info in infos)
    return {
        "size": sum(info.file_size for info in infos),
        "step": last.get("step", state.get("global_step")),
        "train_loss": _last_with(history, "loss"),
        "eval_loss": _last_with(history, "eval_loss"),
        "model": architectures[0] if isinstance(architectures, list) and architectures else None,
        "version": config.get("transformers_version"),
        "inference_ready": bool(config) and has_weights,
    }
