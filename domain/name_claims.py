"""The claim of a new job's name, without reading it first where it was never claimed.

A submission saves its job with the claim of its name (the ``JobName`` aggregate), and a
name's claim is read only to claim it again: a name this application never saw claimed is
claimed as new, unread, and the save's optimistic-concurrency check says whether it was claimed
before after all (by another replica, or before a restart). Then the claim is read and the
save tried again. A name it saw claimed is read at once: on PostgreSQL a conflict costs a gap
in the ledger's positions, not only a retry.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.persistence import RecordConflictError

from domain.job_name import JobName

T = TypeVar("T")
NAMES_SEEN = 65536
"""The most names remembered as claimed (forgotten all at once past it: then read again)."""


class NameClaims:
    def __init__(self, repository: Any) -> None:
        self._repository = repository
        self._seen: dict[UUID, None] = {}

    def claim(self, owner: str, name: str, job_id: UUID, *, read: bool) -> JobName:
        """``name`` claimed for the job: a new claim, unless ``read`` finds an earlier one
        (:class:`~domain.errors.NameTaken` when a live job holds it)."""
        if read:
            with suppress(AggregateNotFoundError):
                index: JobName = self._repository.get(JobName.create_id(owner, name))
                index.claim(job_id)
                return index
        return JobName(owner=owner, name=name, job_id=job_id)

    def saving(
        self, owner: str, name: str, save: Callable[[bool], T],
        retrying: Callable[[Callable[[], T]], T],
    ) -> T:  # fmt: skip
        """``save(read)`` under ``retrying``: unread first for a name never seen claimed, read
        after a conflict; the name is remembered once saved."""
        index_id = JobName.create_id(owner, name)
        read = index_id in self._seen

        def attempt() -> T:
            nonlocal read
            try:
                saved = save(read)
            except RecordConflictError:
                read = True
                raise
            if len(self._seen) >= NAMES_SEEN:
                self._seen.clear()
            self._seen[index_id] = None
            return saved

        return retrying(attempt)
