"""An agent's upload completed: the store makes the object from its parts, its size is checked,
the archive is checked through the store's reader, and the ledger records it
(``CheckpointRecorded`` or ``OutputsRecorded``) with its size and SHA-256; the views are waited
for and the answer every later completion gets is kept with the session. A made object the
ledger refuses goes, with its session. The routes (:mod:`api.http.routes.uploads`) only check
the caller and shape the answer."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from api.artifacts.archives import (
    ArchiveTooLarge,
    InvalidArchive,
    check_output,
    describe_checkpoint,
)
from api.artifacts.store import ArtifactStore, Part, UploadIncomplete
from api.artifacts.uploads import UploadSession, UploadSessions
from common.attempts import output_attempt
from domain.application import TrainingJobs
from domain.errors import DomainError, JobDeleted
from domain.ids import checkpoint_id as derive_checkpoint_id
from domain.lifecycle import ROWS
from domain.statuses import Status
from projections.projector import ProjectionTimeout, Projector
from projections.queries import Queries

log = logging.getLogger(__name__)
EVENT = {"checkpoint": "CheckpointRecorded", "output": "OutputsRecorded"}
"""The event that records each kind of artifact."""


@dataclass(frozen=True)
class ArtifactRecords:
    """Completes agents' uploads and records their artifacts in the ledger."""

    store: ArtifactStore
    sessions: UploadSessions
    jobs: TrainingJobs
    projector: Projector
    queries: Queries

    def recorded(self, document: dict[str, Any], kind: str, name: str | None, node_index: int,
                 attempt: int = 1) -> dict[str, Any] | None:  # fmt: skip
        """The checkpoint or output (of ``attempt``) the ledger holds already, as the views
        show it."""
        if kind == "checkpoint" and name is not None:
            wanted = derive_checkpoint_id(UUID(document["id"]), name, node_index)
            return next((row for row in self.queries.checkpoints(document["id"])
                         if row["id"] == wanted), None)  # fmt: skip
        return next((output for output in document.get("outputs") or []
                     if output["node_index"] == node_index
                     and output_attempt(document, output) == attempt), None)  # fmt: skip

    @staticmethod
    def refuse_unless_recordable(document: dict[str, Any], kind: str) -> None:
        """Refused as the ledger would refuse the event, before a byte is sent."""
        if document.get("deleted_at"):
            raise JobDeleted(document["name"])
        row = ROWS[EVENT[kind]]
        status = Status(document["status"])
        if status not in row.sources:
            raise row.refuse(document["name"], status)

    def complete(self, session: UploadSession, document: dict[str, Any], parts: Sequence[Part],
                 size: int, sha256: str) -> UploadSession:  # fmt: skip
        """The session with its answer: the artifact recorded now, by another upload of it, or
        by this one's earlier completion (a completion sent again gets the same answer)."""
        if session.answer is not None:
            return session
        answer = (self.recorded(document, session.kind, session.name, session.node_index)
                  if session.kind == "checkpoint" else None)  # fmt: skip
        if answer is not None and session.completed_at is None:  # another upload recorded it
            self.store.abort_upload(session.key, session.started)
        elif answer is None:
            answer = self._make_and_record(session, document, parts, size, sha256)
        self.sessions.answered(session.id, answer)
        return replace(session, answer=answer)

    def _make_and_record(
        self, session: UploadSession, document: dict[str, Any], parts: Sequence[Part], size: int,
        sha256: str,
    ) -> dict[str, Any]:  # fmt: skip
        made = self._made(session, parts)
        if made != size:
            self._discard(session)
            raise UploadIncomplete(f"the parts make {made} bytes, not the {size} bytes of the "
                                   "archive")  # fmt: skip
        try:
            with self.store.open(session.key) as handle:
                if session.kind == "checkpoint":
                    metadata = describe_checkpoint(handle, self.store.limits)
                else:
                    check_output(handle, self.store.limits)
            if session.kind == "output":
                return self._record_output(session, size, sha256)
            return self._record_checkpoint(session, document, size, sha256, metadata)
        except (InvalidArchive, ArchiveTooLarge, DomainError):
            self._discard(session)
            raise

    def _made(self, session: UploadSession, parts: Sequence[Part]) -> int:
        """The object the parts make (made once: a completion sent again finds it made)."""
        if session.completed_at is not None:  # made before, not recorded: the ledger refused
            return self.store.size(session.key) or 0
        try:
            ordered = sorted(parts, key=lambda part: part.number)
            made = self.store.complete_upload(session.key, session.started, ordered)
        except UploadIncomplete:
            again = self.sessions.get(session.id)  # completed meanwhile by a request sent twice?
            if again is None or again.completed_at is None:
                raise
            made = self.store.size(session.key) or 0
        self.sessions.made(session.id)
        return made

    def _record_output(self, session: UploadSession, size: int, sha256: str) -> dict[str, Any]:
        outcome = self.jobs.record_outputs(UUID(session.job_id), session.node_id,
                                           session.node_index, size, sha256)  # fmt: skip
        self.projector.wait(outcome.position)
        return {"node_index": session.node_index, "size": size, "sha256": sha256}

    def _record_checkpoint(self, session: UploadSession, document: dict[str, Any], size: int,
                           sha256: str, metadata: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        job_id = UUID(session.job_id)
        assert session.name is not None
        placements = document.get("placements") or []
        node_name = (placements[session.node_index]["node"] if placements
                     else document.get("node") or session.node_id)  # fmt: skip
        checkpoint = {"id": derive_checkpoint_id(job_id, session.name, session.node_index),
                      "name": session.name, "node": node_name, "node_index": session.node_index,
                      **metadata, "archive_size": size, "sha256": sha256}  # fmt: skip
        outcome = self.jobs.record_checkpoint(job_id, session.node_id, checkpoint)
        position = outcome.position
        if position is None:  # recorded before (a completion whose answer was lost, sent again)
            position = self.jobs.recorder.max_notification_id()  # type: ignore[attr-defined]
        self.projector.wait(position)  # the views show it, when this returns
        shown = self.recorded(document, "checkpoint", session.name, session.node_index)
        if shown is None:  # cannot be, once the views hold the event: a 503 to try again
            raise ProjectionTimeout(f"the views do not show checkpoint {checkpoint['id']} yet")
        return dict(shown)

    def _discard(self, session: UploadSession) -> None:
        """A made object the ledger will not record goes, with its session."""
        self.store.delete(session.key)
        self.sessions.drop(session.id)
