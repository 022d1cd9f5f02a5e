"""What an agent that (re)starts finds on its node: processes of its jobs that outlived the agent
before it. Those of jobs the control plane still lists for the node are followed again (a
:class:`node_agent.supervisor.JobSupervisor` that is ``adopting``); the others are ended here,
before any new job starts, so that none of them keeps an accelerator a new job is given."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

from node_agent.models import marked_job
from node_agent.run.processes import end_processes, marked_processes

log = logging.getLogger("flexai.agent")


def end_orphans(work_dir: Path, listed: Collection[str], grace: float) -> list[int]:
    """End every process of this agent's jobs (by their marker) that the control plane does not
    list for this node any more; return those that survived SIGKILL."""

    def orphans() -> dict[int, str]:
        jobs = {pid: marked_job(marker, work_dir) for pid, marker in marked_processes().items()}
        return {pid: job for pid, job in jobs.items() if job is not None and job not in listed}

    found = orphans()
    for pid, job in sorted(found.items()):
        log.warning(
            "ending process %d of job %s: it outlived an earlier agent, and the control plane "
            "no longer lists that job for this node",
            pid,
            job,
        )
    if not found:
        return []
    survivors = end_processes(lambda: list(orphans()), grace)
    if survivors:
        log.error(
            "processes %s of jobs no longer on this node survived SIGKILL (stuck in the "
            "kernel); the node's operator must end them",
            ", ".join(map(str, survivors)),
        )
    return survivors
