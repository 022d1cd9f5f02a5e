"""Zip archives as the control plane reads them: within limits (no zip bomb), every entry a
plain file or directory named inside the archive (no zip-slip), and what a checkpoint tells of
its model.

They read any seekable binary file: a file of the local store, or an object of the S3 store
read by ranged requests (the end record, the central directory and the two small JSON files
only, never the weights).
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz", ".gguf", ".onnx", ".ckpt")
METADATA_MAX_BYTES = 16 * 2**20
"""``trainer_state.json`` and ``config.json`` larger than this are not read (a zip bomb's)."""


class InvalidArchive(Exception):
    pass


class ArchiveTooLarge(Exception):
    pass


@dataclass(frozen=True)
class ArchiveLimits:
    max_entries: int = 100_000
    max_unpacked_bytes: int = 256 * 2**30


def declared_entries(handle: IO[bytes]) -> int:
    """The entry count the archive's end record declares, read before the directory is parsed
    (a directory of millions of entries would take gigabytes to load)."""
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
def open_archive(handle: IO[bytes], limits: ArchiveLimits) -> Iterator[zipfile.ZipFile]:
    """A zip archive within the limits on entries and unpacked bytes."""
    entries = declared_entries(handle)
    if entries > limits.max_entries:
        raise ArchiveTooLarge(
            f"the archive holds {entries} entries; at most {limits.max_entries} are accepted"
        )
    try:
        archive = zipfile.ZipFile(handle)
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


def check_output(handle: IO[bytes], limits: ArchiveLimits) -> None:
    """InvalidArchive or ArchiveTooLarge unless the archive is a safe output directory."""
    with open_archive(handle, limits) as archive:
        refuse_unsafe_entries(archive, "the output directory")


def _read_json(archive: zipfile.ZipFile, file_name: str) -> dict[str, Any]:
    matches = sorted(
        (info for info in archive.infolist() if PurePosixPath(info.filename).name == file_name),
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
    source: bytes | IO[bytes], limits: ArchiveLimits | None = None
) -> dict[str, Any]:
    """Step and losses from trainer_state.json, model and version from config.json; ``size``
    is the bytes its files unpack to."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    with open_archive(handle, limits or ArchiveLimits()) as archive:
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
