"""Datasets: each owner's named datasets and the versions pushed under each name.

A version is an archive the control plane stores once per content hash (the SHA-256 of the
archive). Pushing a name again records a new version, the one later jobs get; pushing the
content the latest version already holds records nothing. A job keeps the hash of the version
it was submitted with in its spec, so the versions before stay readable in its history.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate, event

import domain.values as values
from domain.actors import Actor

NAMESPACE = UUID("0b6a7f64-5c2e-4d1a-9f3b-8e1d2c4a6b59")


class Dataset(Aggregate):
    """One owner's dataset name; its ``Pushed`` events are its versions, oldest first."""

    @staticmethod
    def create_id(owner: str, name: str) -> UUID:
        return uuid5(NAMESPACE, f"dataset\x00{owner}\x00{name}")

    @classmethod
    def create(cls, owner: str, name: str, by: Actor) -> Dataset:
        values.check_text(owner, "owner", max_length=values.MAX_LABEL)
        values.check_dataset_name(name)
        return cls(owner=owner, name=name, by=by)

    @event("Created")
    def __init__(self, owner: str, name: str, by: Actor) -> None:
        self.owner = owner
        self.name = name
        self.versions: list[dict[str, Any]] = []

    @property
    def latest(self) -> dict[str, Any] | None:
        return self.versions[-1] if self.versions else None

    def push(
        self, content_hash: str, size: int, files: int, by: Actor, archive_size: int | None = None
    ) -> bool:
        """Record a new version (``size``: its files' bytes; ``archive_size``: its archive's,
        whose SHA-256 is ``content_hash``); False (and nothing recorded) when the latest holds
        this content already, as a resent push does."""
        values.check_content_hash(content_hash)
        values.check_int(size, "size", 0, values.BIGINT_MAX)
        values.check_int(files, "files", 0, values.BIGINT_MAX)
        if archive_size is not None:
            values.check_int(archive_size, "archive_size", 0, values.BIGINT_MAX)
        if self.latest is not None and self.latest["content_hash"] == content_hash:
            return False
        version = len(self.versions) + 1
        self._pushed(version=version, content_hash=content_hash, size=size, files=files, by=by,
                     archive_size=archive_size)  # fmt: skip
        return True

    # ``archive_size``: the versions pushed before it was recorded have none, and load with None.
    @event("Pushed")
    def _pushed(self, version: int, content_hash: str, size: int, files: int, by: Actor,
                archive_size: int | None = None) -> None:  # fmt: skip
        self.versions.append({"version": version, "content_hash": content_hash, "size": size,
                              "files": files, "archive_size": archive_size})  # fmt: skip
