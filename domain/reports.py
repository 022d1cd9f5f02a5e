"""An agent's reports on a job (built, exited, stopped, ...), each applied once: which node of
the job sent it, whether the ledger holds it already, and the command it makes of the job. The
application service (:mod:`domain.application`) loads, applies and saves."""

from __future__ import annotations

from typing import Any

from common.contract import Report
from domain.actors import Actor, agent
from domain.errors import DomainError
from domain.failures import is_infrastructure
from domain.job import TrainingJob
from domain.job_facts import end_moment
from domain.sharing import EXITED
from domain.statuses import Status


class WrongNode(DomainError):
    pass


# The status an agent report leads to; a resend finds the job there already.
REPORT_STATUS: dict[str, Status] = {
    Report.BUILD_FAILED: Status.FAILED,
    Report.FAILED: Status.FAILED,
    Report.STOPPED: Status.STOPPED,
    Report.STOP_FAILED: Status.STOP_FAILED,
}


def reporting_node(job: TrainingJob, node_id: str, node_index: int | None = None
                   ) -> tuple[int, Actor]:  # fmt: skip
    """The index of the reporting node in ``job`` (which must be placed there), and the
    agent as actor."""
    index = job.placement_index(node_id, node_index)
    if index is None:
        raise WrongNode(
            f"job '{job.name}' is not assigned to node {node_id}"
            + (f" as node index {node_index}" if node_index is not None else "")
            + "; drop it and take the node's current assignments"
        )
    return index, agent(job.placements[index]["node_name"])


def report_facts(report: dict[str, Any]) -> dict[str, Any]:
    """What a report says beyond its kind and its node (kept when the report is refused)."""
    return {key: value for key, value in report.items()
            if key not in ("type", "node_id", "node_index") and value is not None}  # fmt: skip


def apply_report(
    job: TrainingJob, kind: str, report: dict[str, Any], by: Actor, index: int
) -> bool:
    """Apply one report of node ``index``; False when it is a resend that changes nothing."""
    if kind == Report.LOGS_UNAVAILABLE:
        return job.note_logs_unavailable(
            report["message"], report["offset"], report["written"], by=by
        )
    if kind == Report.BUILT:
        return job.record_built(index, report.get("commit"), report.get("master_port"), by=by,
                                image_digest=report.get("image_digest"))  # fmt: skip
    if _already_recorded(job, kind, report, index):
        return False
    ended = end_moment(report.get("ended_at"))  # when the entry point ended, if it says
    if kind == Report.BUILD_FAILED:
        _build_failed(job, report, by, index)
    elif kind == Report.EXITED:
        _exited(job, int(report["exit_code"]), by, index, ended)
    elif kind == Report.FAILED:
        if job.status == Status.IN_PROGRESS and job.retry_if_owed(
            report["code"], _on_node(job, report["message"], index), by, report.get("exit_code")
        ):
            return True
        job.fail(code=report["code"], message=report["message"], by=by, node_index=index,
                 ended_at=ended, exit_code=report.get("exit_code"))  # fmt: skip
    elif kind == Report.STOPPED and job.status == Status.IN_PROGRESS and job.preemption is not None:
        job.yield_node(by=by, exit_code=report.get("exit_code"), node_index=index)
    elif kind == Report.STOPPED:
        job.confirm_stopped(by=by, exit_code=report.get("exit_code"), node_index=index,
                            ended_at=ended)  # fmt: skip
    elif kind == Report.STOP_FAILED:
        job.fail_stop(message=report["message"], by=by)
    else:
        raise DomainError(f"unknown report type '{kind}'")
    return True


def _build_failed(job: TrainingJob, report: dict[str, Any], by: Actor, index: int) -> None:
    """A node could not build the job, or (an infrastructure failure) its agent failed before
    the entry point started: retried while the job has retries left; once built and waiting
    for its accelerators, with none left, it looks for other nodes, as from a lost node."""
    code, message = report["code"], report["message"]
    if job.status in (Status.BUILDING, Status.ENQUEUED) and job.retry_if_owed(
        code, _on_node(job, message, index), by
    ):
        return
    if job.status == Status.ENQUEUED and is_infrastructure(code):
        job.requeue(f"{_on_node(job, message, index)}; the job looks for another node", by=by)
        return
    job.fail_build(code=code, message=message, commit=report.get("commit"), by=by,
                   node_index=index)  # fmt: skip


def _exited(job: TrainingJob, exit_code: int, by: Actor, index: int, ended_at: str | None
            ) -> None:  # fmt: skip
    """An entry point's exit: an exit code the job retries on, with retries left, is retried
    (``Retried``); any other ends or fails the job."""
    attempt = f"attempt {job.attempt} ended with exit code {exit_code}"
    if (exit_code and job.status == Status.IN_PROGRESS
            and job.retry_if_owed(EXITED, _on_node(job, attempt, index), by, exit_code)):
        return
    job.finish(exit_code=exit_code, by=by, node_index=index, ended_at=ended_at)


def _on_node(job: TrainingJob, message: str, index: int) -> str:
    """A retry's message names the node the attempt failed on."""
    if not job.placements or index >= len(job.placements):
        return message
    return f"{message} on node {job.placements[index]['node_name']}"


def _already_recorded(job: TrainingJob, kind: str, report: dict[str, Any], index: int) -> bool:
    """Whether this report of node ``index`` is a resend of one the ledger holds."""
    placement = job.placements[index] if index < len(job.placements) else {}
    if kind == Report.EXITED:  # a report leading where the job is already changes nothing
        if report.get("exit_code") == 0:
            return job.status == Status.SUCCEEDED or placement.get("exit_code") == 0
        return job.status == Status.FAILED
    if kind == Report.STOPPED:  # or the preemption it confirms is recorded, the job waits again
        yielded = job.status == Status.ENQUEUED and getattr(job, "yielded", False)
        return job.status == Status.STOPPED or yielded or bool(placement.get("stopped"))
    return REPORT_STATUS.get(kind) == job.status
