"""Reports about one job to the control plane (the Report types of ``docs/design.md``).

Every report names the node and its index in the job. A report the control plane refuses (a
409: the job is already terminal, say) is final: it is recorded there for audit, and never
sent again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from common.contract import ENDING_REPORTS, Report
from node_agent.client import ApiError, ApiUnavailable, ControlPlaneClient
from node_agent.models import Rendezvous, indices

log = logging.getLogger("flexai.agent")

MAX_MESSAGE = 4096
"""The longest report message the control plane takes."""

ENDING = ENDING_REPORTS
"""The reports that may carry ``ended_at``."""
TRY_ONCE = threading.Event()
"""``give_up`` for a reporter that tries each report once (within its ``retry_for``)."""
TRY_ONCE.set()


@dataclass(frozen=True)
class Answer:
    """``accepted``: the report was recorded; ``status``: the job's status after it (or now);
    ``unreachable``: the control plane could not be reached, so a later try may succeed;
    ``accelerators``: after ``built``, this node's, when the control plane allocated them at
    once; ``rendezvous``: a multi-node job's meeting point, when the answer gives it."""

    accepted: bool
    status: str | None
    unreachable: bool = False
    accelerators: tuple[int, ...] | None = None
    rendezvous: Rendezvous | None = None


class JobReporter:
    """Sends one job's reports; keeps retrying while the control plane is unreachable,
    until ``give_up`` is set (a reporter built with ``give_up`` already set tries once)."""

    def __init__(
        self,
        client: ControlPlaneClient,
        node_id: str,
        job_id: str,
        give_up: threading.Event | None = None,
        retry_for: float | None = None,
        node_index: int = 0,
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.job_id = job_id
        self.give_up = give_up or threading.Event()
        self.ended_at: str | None = None
        """When the entry point ended (ISO 8601, from its exit-code file), once known: sent with
        the reports that end the job, so its end is the process's, not the report's (the
        outputs' upload, or an agent that was down, comes between them)."""
        self.retry_for = retry_for
        self.node_index = node_index

    def built(
        self, commit: str, master_port: int | None = None, image_digest: str | None = None
    ) -> Answer:
        """The build succeeded here; ``master_port``: node 0's rendezvous port (nnodes > 1);
        ``image_digest``: the manifest digest of the image the job runs in, if it names one."""
        if image_digest is None:  # a control plane without images takes the report as before
            return self.send(Report.BUILT, commit=commit, master_port=master_port)
        return self.send(Report.BUILT, commit=commit, master_port=master_port,
                         image_digest=image_digest)  # fmt: skip

    def build_failed(self, code: str, message: str, commit: str | None) -> Answer:
        return self.send(Report.BUILD_FAILED, code=code, message=message, commit=commit)

    def exited(self, exit_code: int) -> Answer:
        return self.send(Report.EXITED, exit_code=exit_code)

    def failed(self, code: str, message: str, exit_code: int | None = None) -> Answer:
        """``exit_code``: the entry point's, where it ended (a time limit's SIGTERM)."""
        if exit_code is None:
            return self.send(Report.FAILED, code=code, message=message)
        return self.send(Report.FAILED, code=code, message=message, exit_code=exit_code)

    def stopped(self, exit_code: int | None = None) -> Answer:
        """``exit_code``: the entry point's, when its process ended and the code is known."""
        if exit_code is None:
            return self.send(Report.STOPPED)
        return self.send(Report.STOPPED, exit_code=exit_code)

    def stop_failed(self, message: str) -> Answer:
        return self.send(Report.STOP_FAILED, message=message)

    def logs_unavailable(self, message: str, offset: int, written: int) -> Answer:
        """The logs cannot be shipped past ``offset`` for now (``written`` bytes exist)."""
        return self.send(
            Report.LOGS_UNAVAILABLE, message=report_text(message), offset=offset, written=written
        )

    def send(self, kind: str, **facts: Any) -> Answer:
        report = {"node_id": self.node_id, "node_index": self.node_index, "type": kind, **facts}
        if self.ended_at is not None and kind in ENDING:
            report["ended_at"] = self.ended_at
        while True:
            try:
                answer = self.client.report(self.job_id, report, retry_for=self.retry_for)
            except ApiUnavailable as error:
                if self.give_up.is_set():
                    log.warning("job %s: report %s not sent: %s", self.job_id, kind, error)
                    return Answer(False, None, unreachable=True)
                log.warning(
                    "job %s: report %s not sent yet, retrying: %s", self.job_id, kind, error
                )
                self.give_up.wait(1.0)
                continue
            except ApiError as error:
                current = error.problem.get("current_status")
                log.warning("job %s: report %s refused: %s", self.job_id, kind, error)
                return Answer(False, str(current) if current else None)
            status = str(answer.get("status") or "")
            log.info("job %s: reported %s -> %s", self.job_id, kind, status or "?")
            return Answer(
                True,
                status or None,
                accelerators=indices(answer.get("accelerators")),
                rendezvous=Rendezvous.from_json(answer.get("rendezvous")),
            )


def report_text(text: str) -> str:
    """``text`` as the control plane takes it: no control character but newline and tab, at
    most :data:`MAX_MESSAGE` characters (the end kept: it says where the log is)."""
    clean = "".join(c if c in "\n\t" or c.isprintable() else " " for c in text)
    return clean if len(clean) <= MAX_MESSAGE else "..." + clean[-(MAX_MESSAGE - 3) :]
