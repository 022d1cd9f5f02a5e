"""The scheduler's deadlines: nodes that went silent, stops no node confirmed, jobs past their
time limit. The leader's work, each round (:mod:`api.scheduling.scheduler`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import UUID

from api.scheduling.parts import SchedulingParts
from common.durations import human_duration
from common.job_spec import JobSpec
from domain.application import TrainingJobs
from domain.errors import DomainError
from domain.statuses import Status

log = logging.getLogger("api.scheduling.scheduler")
DEFAULT_STOP_GRACE_S = 10.0
"""The agent's default --stop-grace, for jobs that did not set their own."""


def attempt(command: Callable[..., object], *args: object) -> bool:
    """Run one command; another replica may have moved the job on already."""
    try:
        command(*args)
    except DomainError as error:
        log.info("scheduler skipped a job: %s", error)
        return False
    return True


def lose_silent_nodes(parts: SchedulingParts, started_at: datetime) -> None:
    """Jobs on nodes silent past their lease (counted from ``started_at``, when this server
    began to schedule) fail ``node_lost``, or look for other nodes when they only waited."""
    timeout = parts.settings.node_timeout_s
    now = datetime.now(UTC)
    if now - started_at < timedelta(seconds=timeout):
        return  # a lease runs only while this server does: agents wait out its restart
    seen = parts.state.last_seen()
    for row in parts.queries.nodes():
        last = seen.get(row["id"])
        if last is not None and now - datetime.fromisoformat(last) < timedelta(seconds=timeout):
            continue
        job_ids = parts.queries.jobs_on_node(row["id"])
        if not job_ids:
            continue
        message = (
            f"node {row['name']} was lost: last heard of at {last or 'no time'}, more than "
            f"{timeout:g} s before {now.isoformat(timespec='seconds')}"
        )
        log.warning("%s; %d job(s) there", message, len(job_ids))
        move_jobs_off(parts.jobs, row["id"], job_ids, message)


def move_jobs_off(jobs: TrainingJobs, node_id: str, job_ids: list[str], message: str,
                  left: str | None = None) -> None:  # fmt: skip
    """The node's jobs move on as from a lost node (``left``: its name, when its agent said it
    stopped and ended their processes; see ``TrainingJobs.node_lost``)."""
    for job_id in job_ids:
        attempt(jobs.node_lost, UUID(job_id), node_id, message, left)


def end_overdue(parts: SchedulingParts) -> None:
    """Stops no node confirmed in time fail, and jobs past their time limit whose node did not
    end them fail ``time_limit_exceeded``."""
    confirm = parts.settings.stop_confirm_timeout_s
    now = datetime.now(UTC)
    for row in parts.queries.jobs_in([Status.STOP_IN_PROGRESS, Status.IN_PROGRESS]):
        document = parts.queries.job(row["id"])
        if document is None:
            continue
        spec = JobSpec.from_dict(document["spec"])
        grace = spec.stop_grace_s
        margin = (DEFAULT_STOP_GRACE_S if grace is None else grace) + confirm
        job_id = UUID(row["id"])
        if row["status"] == Status.STOP_IN_PROGRESS.value:
            asked = datetime.fromisoformat((document.get("stop") or {}).get("requested_at")
                                           or row["updated_at"])  # fmt: skip
            if now - asked > timedelta(seconds=margin):
                nodes = ", ".join(p["node"] for p in document.get("placements", [])) or "-"
                attempt(parts.jobs.fail_stop, job_id,
                        f"no node confirmed the stop within {margin:g} s of the request; "
                        f"the job's processes may still run on {nodes}")  # fmt: skip
            continue
        limit = spec.time_limit_s
        started = document.get("started_at")
        if (
            limit
            and started
            and now - datetime.fromisoformat(started) > timedelta(seconds=limit + margin)
        ):
            attempt(parts.jobs.fail_overdue, job_id,
                    f"the job ran past its time limit of {human_duration(limit)} and its "
                    f"node did not end it within {margin:g} s")  # fmt: skip
