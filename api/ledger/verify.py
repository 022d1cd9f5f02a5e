"""``flexai admin verify``: the ledger's chain recomputed, every job folded from the ledger
compared with what the views serve, and every artifact the ledger names looked for in the
artifact store (:mod:`api.ledger.artifact_check`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError

from api.ledger.artifact_check import Artifact, Depth, ledger_artifacts, problem_of
from api.ledger.parts import LedgerParts
from domain.job import TrainingJob
from domain.topics import JOB_EVENT_TOPICS
from ledger.chain import RawEvent, chain_rows, is_chained, raw_events, verify_chain

LATEST = 2**62
"""A version past any job's: folds from the stored events, never from the aggregate cache."""
MAX_DIFFERENCES = 50


def verify_ledger(
    parts: LedgerParts, expect_digest: str | None = None, artifacts: Depth = "shallow"
) -> dict[str, Any]:
    recorder = parts.jobs.recorder
    head = recorder.max_notification_id() or 0  # type: ignore[attr-defined]
    parts.projector.wait(head)
    job_ids: set[str] = set()

    def events() -> Iterator[RawEvent]:
        for event in raw_events(recorder):
            if event.topic.startswith(JOB_EVENT_TOPICS):
                job_ids.add(event.originator_id)
            yield event

    stream = events()
    answer: dict[str, Any] = {"events": 0, "chained": 0, "unchained_before": None,
                              "head_digest": None, "ledger_problems": []}  # fmt: skip
    if is_chained(recorder):
        report = verify_chain(stream, chain_rows(recorder))
        answer.update(events=report.events, chained=report.chained,
                      unchained_before=report.unchained_before,
                      head_digest=report.head_digest or None,
                      ledger_problems=list(report.problems))  # fmt: skip
    else:
        answer["ledger_problems"].append(
            "this ledger's recorder keeps no hash chain: nothing to check it against"
        )
    for _ in stream:  # the rest, when the chain check stopped early: every job is compared
        pass
    if expect_digest and answer["head_digest"] != expect_digest:
        answer["ledger_problems"].append(
            f"the head digest is {answer['head_digest']}, not {expect_digest} as expected: "
            "the ledger (and its chain) changed since that digest was taken"
        )
    answer["jobs"] = len(job_ids)
    answer["view_differences"] = _view_differences(parts, job_ids)
    answer.update(_artifact_problems(parts, artifacts))
    answer["ok"] = not (answer["ledger_problems"] or answer["view_differences"]
                        or answer["artifact_problems"])  # fmt: skip
    return answer


def _artifact_problems(parts: LedgerParts, depth: Depth) -> dict[str, Any]:
    """Each artifact the ledger names that the store lacks or holds altered: its job (or
    dataset), kind and key, and what is wrong."""
    named = ledger_artifacts(parts.jobs) if depth != "none" else []
    problems = []
    for artifact in named:
        problem = problem_of(parts.artifacts, artifact, depth)
        if problem is not None:
            problems.append({**_whose(parts, artifact), "kind": artifact.kind,
                             "key": artifact.key, "problem": problem})  # fmt: skip
    return {"artifacts": depth, "artifacts_checked": len(named), "artifact_problems": problems}


def _whose(parts: LedgerParts, artifact: Artifact) -> dict[str, str | None]:
    if artifact.job_id is None:
        return {"job": None, "name": artifact.dataset}
    document = parts.queries.job(artifact.job_id)
    return {"job": artifact.job_id, "name": document["name"] if document else None}


def _view_differences(parts: LedgerParts, hex_ids: set[str]) -> list[str]:
    with parts.database.transaction() as cursor:
        cursor.execute("SELECT id, owner, name, status, node, deleted_at FROM job_list")
        rows = {str(row["id"]): row for row in cursor.fetchall()}
    job_ids = {str(UUID(hex_id)) for hex_id in hex_ids}
    differences = []
    for job_id in sorted(job_ids | set(rows)):
        said = _compare(parts, job_id, rows.get(job_id))
        if said:  # again once the views caught up: a job that changed meanwhile is no fault
            parts.projector.wait(parts.jobs.recorder.max_notification_id() or 0)  # type: ignore[attr-defined]
            with parts.database.transaction() as cursor:
                cursor.execute("SELECT id, owner, name, status, node, deleted_at FROM job_list "
                               "WHERE id = ?", (job_id,))  # fmt: skip
                said = _compare(parts, job_id, cursor.fetchone())
        differences.extend(said)
        if len(differences) >= MAX_DIFFERENCES:
            differences.append(f"(stopped after {MAX_DIFFERENCES} differences)")
            break
    return differences


def _compare(parts: LedgerParts, job_id: str, row: Any) -> list[str]:
    try:
        job: TrainingJob = parts.jobs.repository.get(UUID(job_id), version=LATEST)
    except AggregateNotFoundError:
        job = None  # type: ignore[assignment]
    except Exception as error:  # noqa: BLE001 - an event the ledger cannot read or apply
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        return [f"job {job_id}: the ledger cannot fold it ({reason})"]
    if job is None:
        return [f"job {job_id}: the views show it, the ledger has no such job"] if row else []
    if row is None:
        return [f"job {job_id} ({job.name}): in the ledger, missing from the views"]
    folded = {"owner": job.owner, "name": job.name, "status": str(job.status),
              "deleted": bool(job.deleted), "node": job.node_name}  # fmt: skip
    shown = {"owner": row["owner"], "name": row["name"], "status": row["status"],
             "deleted": row["deleted_at"] is not None, "node": row["node"]}  # fmt: skip
    return [
        f"job {job_id} ({job.name}): {key} is {shown[key]!r} in the views, {folded[key]!r} in "
        "the ledger"
        for key in folded
        if folded[key] != shown[key]
    ]
