"""What the ``dataset`` commands show (the table, the inspect view, a push's outcome), and a
job's datasets with the versions it was given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cli.output.formats import EMPTY, format_size, format_timestamp
from cli.output.tables import render_table
from cli.output.yaml_like import render_yaml

DATASET_COLUMNS = ("NAME", "SIZE", "FILES", "HASH", "PUSHED")
DATASET_VERSION_COLUMNS = ("VERSION", "HASH", "SIZE", "FILES", "PUSHED", "BY")
SHORT_HASH = 12


def short_hash(content_hash: str | None) -> str:
    return content_hash[:SHORT_HASH] if content_hash else EMPTY


def dataset_pins(spec: Mapping[str, Any]) -> list[str]:
    """A job's datasets, each with the version it was given (``name @ hash``) if pushed."""
    pins: Mapping[str, str] = spec.get("dataset_hashes") or {}
    mounts: Mapping[str, str] = spec.get("dataset_mounts") or {}
    return [(f"{name} @ {short_hash(pins[name])}" if pins.get(name) else str(name))
            + (f" at /input/{mounts[name]}" if mounts.get(name) else "")
            for name in spec.get("datasets") or []]  # fmt: skip


def render_datasets_table(datasets: Sequence[Mapping[str, Any]]) -> str:
    """The ``dataset list`` table, by name."""
    rows = [
        (
            dataset.get("name"),
            format_size(dataset.get("size")),
            dataset.get("files"),
            short_hash(dataset.get("content_hash")),
            format_timestamp(dataset.get("pushed_at")),
        )
        for dataset in datasets
    ]
    return render_table(DATASET_COLUMNS, rows)


def render_dataset(dataset: Mapping[str, Any]) -> str:
    """The ``dataset inspect`` view: the latest version, then every version."""
    versions = [
        (
            version.get("version"),
            short_hash(version.get("content_hash")),
            format_size(version.get("size")),
            version.get("files"),
            format_timestamp(version.get("pushed_at")),
            version.get("pushed_by"),
        )
        for version in dataset.get("versions") or []
    ]
    size = dataset.get("size")
    detail = {
        "name": dataset.get("name"),
        "version": dataset.get("version"),
        "content hash": dataset.get("content_hash"),
        "size": f"{format_size(size)} ({size} bytes)" if size is not None else None,
        "files": dataset.get("files"),
        "pushed": format_timestamp(dataset.get("pushed_at")),
        "pushed by": dataset.get("pushed_by"),
        "created": format_timestamp(dataset.get("created_at")),
        "versions": render_table(DATASET_VERSION_COLUMNS, versions).splitlines(),
    }
    return render_yaml(detail)


def render_pushed_dataset(dataset: Mapping[str, Any], archive_size: int) -> str:
    """What ``dataset push`` says: the version, its size and files, its full hash."""
    name, version = dataset.get("name"), dataset.get("version")
    what = (
        f"{dataset.get('files')} files, {format_size(dataset.get('size'))} "
        f"(archive {format_size(archive_size)})"
    )
    if dataset.get("changed"):
        head = f"Pushed dataset {name} version {version}: {what}"
    else:
        head = f"Dataset {name} is unchanged: its version {version} holds this content ({what})"
    return "\n".join([
        head,
        f"sha256 {dataset.get('content_hash')}",
        f"Jobs get it with `flexai training run JOB -D {name} ...` at $FLEXAI_INPUT_DIR/{name}",
    ])  # fmt: skip
