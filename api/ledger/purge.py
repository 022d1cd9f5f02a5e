"""``flexai admin purge``: the artifacts of jobs deleted before a moment leave the store, and
each such job's history records it (``ArtifactsPurged``: how many objects went, by whom).

Deleting a job keeps its artifacts: its history stays whole, and its outputs stay fetchable by
id for audit. A purge removes every object under the job's prefix (logs, checkpoints, outputs,
unfinished uploads) with ``delete_job``, then records the event; a job purged is not purged
again. Should the server die between the two, the next purge finds the job still unpurged,
removes nothing more and records it then.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from api.ledger.parts import LedgerParts
from domain.actors import Actor


def purge_deleted(parts: LedgerParts, before: datetime, by: Actor) -> list[dict[str, Any]]:
    """Purge the artifacts of every job deleted before ``before`` (aware) and not purged yet;
    what was purged, oldest deletion first."""
    purged = []
    for document in parts.queries.deleted_jobs():
        deleted_at = datetime.fromisoformat(document["deleted_at"])
        if deleted_at >= before or document.get("artifacts_purged"):
            continue
        objects = parts.artifacts.delete_job(document["id"])
        outcome = parts.jobs.purge_artifacts(UUID(document["id"]), objects, by=by)
        if outcome.position is None:  # another purge recorded it meanwhile
            continue
        parts.projector.wait(outcome.position)
        purged.append({"id": document["id"], "owner": document["owner"],
                       "name": document["name"], "deleted_at": document["deleted_at"],
                       "objects": objects})  # fmt: skip
    return purged
